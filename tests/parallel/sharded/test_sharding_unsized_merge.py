"""Gradient merge over a loader without len() under sharding stage 2/3: the window the data leaves open at the end
of an epoch is reduce-scattered and stepped, as torch DDP all-reduces and steps it."""

import pytest
import torch
from parity import max_abs_diff
from torch import nn

import fleetlite
from fleetlite.testing import run_ranks


class Batches:
    """Five batches for this rank and no len(): the loop learns where the epoch ends only when it has ended."""

    def __init__(self, rank):
        g = torch.Generator().manual_seed(rank)
        self.x = torch.randn(5, 4, 6, generator=g)
        self.y = torch.randint(0, 3, (5, 4), generator=g)

    def __iter__(self):
        return iter(zip(self.x, self.y))


def _fit(rank, world, stage):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    strategy = None if stage is None else {"sharding": True, "sharding_configs": {"stage": stage}}
    t = fleetlite.Trainer(net, torch.optim.AdamW(net.parameters(), lr=0.02), nn.CrossEntropyLoss(),
                          strategy=strategy, device="cpu")
    t.fit(Batches(rank), epochs=2, accumulate_grad_batches=3, verbose=0)
    return t.get_weights(), t.global_step


@pytest.fixture(scope="module")
def _runs() -> dict:
    return {}


@pytest.fixture
def ddp(clean_dist_env, _runs):
    """The plain data-parallel run both stages are compared with: the same for each, so run once per module
    (the first time, under clean_dist_env as the stages' runs are)."""
    if "ddp" not in _runs:
        _runs["ddp"] = run_ranks(_fit, args=(None,), timeout=100)
    return _runs["ddp"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("stage", [2, 3])
def test_unsized_loader_with_gradient_merge_matches_ddp(stage, clean_dist_env, ddp):
    for (weights, steps), (ref, ref_steps) in zip(run_ranks(_fit, args=(stage,), timeout=100), ddp):
        assert steps == ref_steps == 4  # per epoch: a full window of 3 and the flushed one of 2
        assert max_abs_diff(ref, weights) <= 1e-6
