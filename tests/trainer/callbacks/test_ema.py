"""EMA of weights on torch.optim.swa_utils: equal to a hand loop with AveragedModel, evaluation with the averaged
weights on request, and a bit-identical average after resuming from a checkpoint."""

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from trainer_helpers import dataset, mlp, xy

import fleetlite
from fleetlite.trainer.callbacks import EMA, ModelCheckpoint


def _trainer():
    net = mlp()
    return fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.3), nn.CrossEntropyLoss(),
                             metrics=fleetlite.metric.Accuracy(), device="cpu")


def test_ema_equals_hand_loop_and_evaluates_with_average():
    x, y = xy(32)
    net = mlp()
    opt = torch.optim.SGD(net.parameters(), lr=0.3)
    avg = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    for i in range(0, 32, 8):
        nn.functional.cross_entropy(net(x[i:i + 8]), y[i:i + 8]).backward()
        opt.step()
        opt.zero_grad()
        avg.update_parameters(net)
    t = _trainer()
    ema = EMA(0.9)
    t.fit((x, y), epochs=1, batch_size=8, shuffle=False, verbose=0, callbacks=[ema])
    for k, v in avg.module.state_dict().items():
        torch.testing.assert_close(ema.averaged.module.state_dict()[k], v)
    assert int(ema.averaged.n_averaged) == 4
    before = {k: v.clone() for k, v in t.network.state_dict().items()}
    with_ema = t.evaluate((x, y), batch_size=8, verbose=0, callbacks=[ema.evaluating()])
    for k, v in t.network.state_dict().items():
        assert torch.equal(v, before[k])  # training weights put back
    ref = fleetlite.Trainer(avg.module, None, nn.CrossEntropyLoss(), metrics=fleetlite.metric.Accuracy(),
                            device="cpu").evaluate((x, y), batch_size=8, verbose=0)
    assert with_ema["loss"] == pytest.approx(ref["loss"], rel=1e-6) and with_ema["acc"] == ref["acc"]
    with pytest.raises(ValueError):
        EMA(1.0)


def test_ema_resume_is_bit_identical(tmp_path):
    full = EMA(0.8)
    _trainer().fit(dataset(24), epochs=3, batch_size=8, verbose=0, callbacks=[full])
    first = EMA(0.8)
    _trainer().fit(dataset(24), epochs=3, batch_size=8, verbose=0,
                   callbacks=[first, ModelCheckpoint(str(tmp_path), save_freq=1)])
    resumed = EMA(0.8)
    _trainer().fit(dataset(24), epochs=3, batch_size=8, verbose=0, resume=tmp_path / "epoch-0000.pt",
                   callbacks=[resumed, ModelCheckpoint(str(tmp_path / "b"), save_freq=1)])
    for k, v in full.averaged.state_dict().items():
        assert torch.equal(resumed.averaged.state_dict()[k], v), k


def test_compile_ema_decay_adds_the_callback():
    t = _trainer()
    t.compile(t.user_optimizer, t.loss_fn, t.metrics, ema_decay=0.5)
    t.fit(dataset(16), epochs=1, batch_size=8, verbose=0)
    assert int(t.ema.averaged.n_averaged) == 2
