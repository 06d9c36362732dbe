"""Resume keeps every rank's state where the ranks' states differ: under local SGD (weights and momentum between
averagings) and DGC (each rank's u/v residuals), a fit stopped and resumed from its checkpoint ends bit-identical
to the uninterrupted fit on every rank (2 gloo ranks); plain data parallel checkpoints stay as they were."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import fleetlite
from fleetlite.checkpoint import load_checkpoint
from fleetlite.distributed.fleet import DistributedStrategy
from fleetlite.testing import run_ranks
from fleetlite.trainer import callbacks as C

STRATEGIES = {
    # averaged after steps 4, 7, 10, ...: the ranks differ at the stop (step 5) and so does their momentum
    "localsgd": {"localsgd": True, "localsgd_configs": {"k_steps": 3, "begin_step": 1}},
    "adaptive_localsgd": {"adaptive_localsgd": True,
                          "adaptive_localsgd_configs": {"init_k_steps": 2, "begin_step": 1}},
    # compressed from step 2: each rank keeps the residuals it did not send
    "dgc": {"dgc": True, "dgc_configs": {"rampup_begin_step": 2, "rampup_step": 2, "sparsity": [0.9, 0.99]}},
    "dp": {},
}


class StopAt(C.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, step, logs=None):
        if self.trainer.global_step == self.step and self.trainer.at_step_boundary:
            self.trainer.stop_training = True


def _data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(96, 128, generator=g)
    return TensorDataset(x, (x[:, :4].sum(1) > 0).long())


def _fit(which, ckpt, stop=None, resume=None):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 2))  # 16384 weights: DGC compresses them
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    t = fleetlite.Trainer(net, opt, nn.CrossEntropyLoss(), strategy=DistributedStrategy(**STRATEGIES[which]),
                          device="cpu")
    cbs = [C.ModelCheckpoint(str(ckpt), save_freq=None, save_steps=1)] + ([StopAt(stop)] if stop else [])
    t.fit(_data(), epochs=2, batch_size=8, callbacks=cbs, resume=resume, verbose=0)
    state = {k: v.detach().clone() for k, v in t.network.state_dict().items()}
    momentum = [s["momentum_buffer"].clone() for s in t.optimizer.state.values() if "momentum_buffer" in s]
    dgc = t.optimizer.meta.dgc_state
    residuals = [] if dgc is None else [dgc._u[k].clone() for k in sorted(dgc._u)] + [
        dgc._v[k].clone() for k in sorted(dgc._v)]
    return state, momentum, residuals, t.global_step


def _stopped_and_resumed(rank, world, which, root):
    torch.set_num_threads(1)
    straight = _fit(which, f"{root}/straight")
    _fit(which, f"{root}/b", stop=5)
    resumed = _fit(which, f"{root}/b", resume="latest")
    return straight, resumed


def _assert_bit_identical(a, b, what):
    assert len(a) == len(b), what
    for x, y in zip(a, b):
        assert torch.equal(x, y), what


@pytest.mark.timeout(300)
@pytest.mark.parametrize("which", ["localsgd", "adaptive_localsgd", "dgc"])
def test_resume_is_bit_identical_on_every_rank(tmp_path, which):
    results = run_ranks(_stopped_and_resumed, args=(which, str(tmp_path)), timeout=280)
    for rank, (straight, resumed) in enumerate(results):
        assert straight[3] == resumed[3] == 12, rank
        _assert_bit_identical(list(straight[0].values()), list(resumed[0].values()), f"rank {rank} weights")
        _assert_bit_identical(straight[1], resumed[1], f"rank {rank} momentum")
        _assert_bit_identical(straight[2], resumed[2], f"rank {rank} DGC residuals")
    saved = load_checkpoint(tmp_path / "b" / "step-00000005.pt")
    assert [sorted(r["state"]) for r in saved["ranks"]] == [["model", "optimizer"]] * 2
    a, b = (_tensors(r["state"]) for r in saved["ranks"])
    assert len(a) == len(b) and not all(torch.equal(x, y) for x, y in zip(a, b))  # the ranks' states differ


def _tensors(value):
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, dict):
        return [t for k in sorted(value, key=str) for t in _tensors(value[k])]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _plain(rank, world, root):
    torch.set_num_threads(1)
    _fit("dp", root, stop=2)


@pytest.mark.timeout(300)
def test_plain_data_parallel_checkpoints_hold_no_per_rank_state(tmp_path):
    run_ranks(_plain, args=(str(tmp_path),), timeout=280)
    saved = load_checkpoint(tmp_path / "step-00000002.pt")
    assert all("state" not in r for r in saved["ranks"])
