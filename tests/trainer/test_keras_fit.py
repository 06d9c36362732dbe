"""Keras' fit conveniences on the Trainer: validation_split (last fraction), steps_per_epoch, validation_steps,
initial_epoch."""

import pytest
import torch
from trainer_helpers import trainer, xy

import fleetlite


class Count(__import__("fleetlite").callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.train, self.eval, self.epochs = 0, 0, []

    def on_train_batch_end(self, step, logs=None):
        self.train += 1

    def on_eval_batch_end(self, step, logs=None):
        self.eval += 1

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


def test_validation_split_is_the_last_fraction():
    x, y = xy(40)
    t = trainer()
    hist = t.fit((x, y), epochs=1, batch_size=8, validation_split=0.25, verbose=0)
    ref = trainer()
    ref.fit((x[:30], y[:30]), epochs=1, batch_size=8, verbose=0)
    for a, b in zip(t.network.parameters(), ref.network.parameters()):
        assert torch.equal(a, b)  # trained on the first 30 samples only
    assert hist.history["val_loss"][0] == pytest.approx(ref.evaluate((x[30:], y[30:]), verbose=0)["loss"])
    with pytest.raises(ValueError, match="either eval_data or validation_split"):
        trainer().fit((x, y), eval_data=(x, y), validation_split=0.1, verbose=0)
    with pytest.raises(ValueError, match="fraction"):
        trainer().fit((x, y), validation_split=1.5, verbose=0)


def test_steps_validation_steps_and_initial_epoch():
    x, y = xy(64)
    c = Count()
    t = trainer()
    t.fit((x, y), eval_data=(x, y), epochs=3, batch_size=8, steps_per_epoch=3, validation_steps=2,
          initial_epoch=1, callbacks=[c], verbose=0)
    assert c.epochs == [1, 2] and c.train == 6 and c.eval == 4 and t.global_step == 6


def test_save_top_k_keeps_the_k_best(tmp_path):
    import os

    from fleetlite.trainer.callbacks import ModelCheckpoint

    ck = ModelCheckpoint(str(tmp_path), save_freq=None, monitor="val_loss", save_top_k=2)
    x, y = xy(32)
    hist = trainer(lr=0.2).fit((x, y), eval_data=xy(16, seed=3), epochs=5, batch_size=8, callbacks=[ck], verbose=0)
    losses = hist.history["val_loss"]
    best2 = sorted(range(5), key=lambda e: losses[e])[:2]
    tops = sorted(f for f in os.listdir(tmp_path) if f.startswith("top-"))
    assert tops == sorted(f"top-epoch-{e:04d}.pt" for e in best2)
    assert [n for _, n in ck.top_k] == [f"top-epoch-{e:04d}.pt" for e in best2]
    with pytest.raises(ValueError, match="needs a positive integer and a monitor"):
        ModelCheckpoint(str(tmp_path), save_top_k=2)


def _weighted_hand(w_fn, n=32, bs=8):
    from torch import nn
    from trainer_helpers import mlp

    x, y = xy(n)
    net = mlp()
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for i in range(0, n, bs):
        per = nn.functional.cross_entropy(net(x[i:i + bs]), y[i:i + bs], reduction="none")
        (per * w_fn(i, y[i:i + bs])).sum().div(per.shape[0]).backward()
        opt.step()
        opt.zero_grad()
    return net.state_dict()


def test_class_weight_and_sample_weight_equal_weighted_hand_loop():
    x, y = xy(32)
    cw = {0: 1.0, 1: 3.0, 2: 0.5}
    table = torch.tensor([1.0, 3.0, 0.5])
    t = trainer(metrics=False)
    t.fit((x, y), epochs=1, batch_size=8, shuffle=False, class_weight=cw, verbose=0)
    ref = _weighted_hand(lambda i, yb: table[yb])
    for k, v in ref.items():
        torch.testing.assert_close(t.network.state_dict()[k], v, rtol=1e-5, atol=1e-6)
    sw = torch.linspace(0.1, 2.0, 32)
    t = trainer(metrics=False)
    t.fit((x, y), epochs=1, batch_size=8, shuffle=False, sample_weight=sw, class_weight=cw, verbose=0)
    ref = _weighted_hand(lambda i, yb: table[yb] * sw[i:i + 8])
    for k, v in ref.items():
        torch.testing.assert_close(t.network.state_dict()[k], v, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="one per sample"):
        trainer().fit((x, y), sample_weight=sw[:5], verbose=0)


def test_eval_steps_evaluates_inside_epochs_without_disturbing_training():
    x, y = xy(32)
    ev = xy(16, seed=5)
    t = trainer()
    hist = t.fit((x, y), eval_data=ev, epochs=2, batch_size=8, eval_steps=2, shuffle=False, verbose=0)
    ref = trainer()
    ref_hist = ref.fit((x, y), eval_data=ev, epochs=2, batch_size=8, shuffle=False, verbose=0)
    assert [e["step"] for e in t.step_evaluations] == [2, 4, 6, 8]
    assert hist.history == ref_hist.history  # epoch logs (training metrics included) unchanged
    assert t.step_evaluations[-1]["val_loss"] == pytest.approx(hist.history["val_loss"][-1])
    for a, b in zip(t.network.parameters(), ref.network.parameters()):
        assert torch.equal(a, b)


def test_evaluate_and_predict_take_keras_positional_order():
    """Keras' evaluate(x, y, batch_size, verbose, sample_weight, steps, ...) and
    predict(x, batch_size, verbose, steps, ...): evaluate(x, y, batch_size=128) raised "multiple values for
    'batch_size'", and evaluate(x, y, 128) silently took 128 as log_freq."""
    from fleetlite.trainer.metrics import Accuracy

    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), torch.nn.CrossEntropyLoss(),
                          metrics=[Accuracy()], device="cpu")
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    ref = t.evaluate((x, y), batch_size=128, verbose=0)
    assert t.evaluate(x, y, batch_size=128, verbose=0) == ref
    assert t.evaluate(x, y, 128, 0) == ref
    first_two = t.evaluate((x[:16], y[:16]), batch_size=8, verbose=0)
    assert t.evaluate(x, y, 8, 0, None, 2, return_dict=False) == pytest.approx(list(first_two.values()))
    with pytest.raises(TypeError, match="labels tensor"):
        t.evaluate((x, y), 128)              # a number where Keras has y: refused, not taken as log_freq
    with pytest.raises(NotImplementedError, match="sample_weight"):
        t.evaluate(x, y, sample_weight=torch.ones(40))
    assert t.predict(x, 8, 0, 2, stack_outputs=True).shape == (16, 3)   # predict(x, batch_size, verbose, steps)


def test_save_top_k_writes_directories_in_a_dcp_run(tmp_path):
    """Save_top_k wrote .pt files in a run that checkpoints to DCP directories."""
    import os

    from fleetlite.checkpoint import is_checkpoint_dir
    from fleetlite.trainer.callbacks import ModelCheckpoint

    ck = ModelCheckpoint(str(tmp_path), save_freq=None, monitor="val_loss", save_top_k=2, sharded=True)
    x, y = xy(32)
    hist = trainer(lr=0.2).fit((x, y), eval_data=xy(16, seed=3), epochs=4, batch_size=8, callbacks=[ck], verbose=0)
    losses = hist.history["val_loss"]
    best2 = sorted(range(4), key=lambda e: losses[e])[:2]
    tops = sorted(f for f in os.listdir(tmp_path) if f.startswith("top-"))
    assert tops == sorted(f"top-epoch-{e:04d}" for e in best2)
    assert all(is_checkpoint_dir(tmp_path / f) for f in tops)
