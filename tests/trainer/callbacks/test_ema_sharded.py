"""EMA under sharding stages 2 and 3: ``EMA(...)`` and ``compile(ema_decay=...)`` used to die
in ``on_train_begin`` with "FSDP does not support deepcopy". Now the EMA is of the full weights (Note [EMA under
sharding]) and equals, on every rank, the EMA of the same run under plain data parallel on 2 ranks; evaluation
with the averaged weights and ``copy_to`` work on the shards."""

import numpy as np
import pytest
import torch

from fleetlite.testing import run_ranks


class _Data(torch.utils.data.Dataset):
    def __init__(self, n=32):
        g = np.random.default_rng(0)
        self.x = g.random((n, 20)).astype(np.float32)
        self.y = g.integers(0, 10, (n,)).astype(np.int64)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _run(rank, world, stage):
    import fleetlite
    import fleetlite.distributed.fleet as fleet
    from fleetlite.distributed.fleet import fleet as fleet_impl
    from fleetlite.trainer.callbacks import EMA

    torch.set_num_threads(1)
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy(sharding=True, sharding_configs={"stage": stage}) if stage else None
    fleet.init(is_collective=True, strategy=strategy)
    torch.manual_seed(0)
    # no BatchNorm: data parallel evaluates with rank 0's broadcast statistics, sharding with each rank's own
    net = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 10))
    t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.2), torch.nn.CrossEntropyLoss())
    t.compile(t.user_optimizer, t.loss_fn, None, ema_decay=0.8)  # the compile(ema_decay=...) path
    ema = EMA(0.7, use_buffers=False, eval_with_ema=True)  # and the callback, evaluating with the average
    t.fit(_Data(), eval_data=_Data(16), batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[ema])
    trained = t.get_weights()
    with_ema = t.evaluate(_Data(16), batch_size=4, verbose=0, callbacks=[ema.evaluating()])["loss"]
    assert all(torch.equal(v, trained[k]) for k, v in t.get_weights().items())  # training weights put back
    states = [{k: v.detach().clone() for k, v in e.state_dict()["averaged"].items()} for e in (t.ema, ema)]
    t.ema.copy_to(t.network)  # into the shards (collective)
    return states, with_ema, t.get_weights()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", [2, 3])
def test_ema_under_sharding_equals_data_parallel(stage):
    ref = run_ranks(_run, args=(None,), timeout=140)
    got = run_ranks(_run, args=(stage,), timeout=140)
    for (states, with_ema, copied), (ref_states, ref_with_ema, ref_copied) in zip(got, ref):
        for state, ref_state in zip(states, ref_states):
            assert sorted(state) == sorted(ref_state)  # AveragedModel's layout: module.<name>, n_averaged
            assert int(state["n_averaged"]) == int(ref_state["n_averaged"]) == 8
            for k, v in ref_state.items():
                torch.testing.assert_close(state[k], v, rtol=1e-6, atol=1e-7)
        assert with_ema == pytest.approx(ref_with_ema, rel=1e-6)
        for k, v in ref_copied.items():
            torch.testing.assert_close(copied[k], v, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(copied[k], states[0][f"module.{k}"], rtol=0, atol=0)


@pytest.mark.parametrize("use_buffers", [True, False])
def test_full_average_is_averaged_models_arithmetic(use_buffers):
    """The full-weights EMA used under sharding equals ``AveragedModel`` bit for bit, buffers (BatchNorm) too."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from fleetlite.trainer.callbacks.ema import _FullAverage

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 2))
    ref = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.6), use_buffers=use_buffers)
    ours = _FullAverage(net.state_dict(), {n for n, _ in net.named_parameters()}, 0.6, use_buffers)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    for _ in range(4):
        net(torch.randn(8, 6)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        ref.update_parameters(net)
        ours.update(net.state_dict())
    expected = ref.state_dict()
    assert sorted(ours.state_dict()) == sorted(expected)
    for k, v in ours.state_dict().items():
        assert torch.equal(v, expected[k]), k
