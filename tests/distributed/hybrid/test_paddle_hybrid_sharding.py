"""Paddle's test/collective/fleet/hybrid_parallel_sharding_model.py (``TestDistMPTraining``), on 2 gloo ranks.

``sharding_degree=2`` (stage 1): ``SimpleDPNet`` trained by ``fleet.distributed_model`` /
``fleet.distributed_optimizer`` on half of each batch per rank keeps every parameter equal to the same net trained
on the whole batch on one process, ten steps, ``rtol=1e-6``; AdamW (``weight_decay=1e-5``) and Momentum, both with
``ClipGradByGlobalNorm(0.5)``. The optimizer is a sharded one and, at step 2, rank 0's inner optimizer holds the
state of its shard only. (Paddle names the accumulators it expects; torch's optimizers key their state by
parameter, so the check is which parameters rank 0 holds state for: some, not all, and the two ranks together
all, each once.)
"""

import random

import numpy as np
import pytest
import torch
import torch.distributed as tdist

import fleetlite.distributed.fleet as fleet
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

VOCAB, HIDDEN, INNER, OUTPUT, SEQ, BATCH, STEPS = 20, 10, 8, 10, 2, 4, 10


class SimpleDPNet(torch.nn.Module):
    def __init__(self, np_fc1, np_fc2):
        super().__init__()
        self.linear1, self.linear2 = torch.nn.Linear(HIDDEN, INNER), torch.nn.Linear(INNER, HIDDEN)
        self.linear3 = torch.nn.Linear(HIDDEN, OUTPUT)
        self.embedding = torch.nn.Embedding(VOCAB, HIDDEN)
        with torch.no_grad():  # Paddle's layout [in, out] transposed into torch's [out, in]
            self.linear1.weight.copy_(torch.from_numpy(np_fc1.T)), self.linear2.weight.copy_(torch.from_numpy(np_fc2.T))
            for layer in (self.linear1, self.linear2, self.linear3):
                layer.bias.zero_()
            self.linear3.weight.zero_()
            self.embedding.weight.fill_(0.5)

    def forward(self, x):
        x = self.linear3(self.linear2(self.linear1(self.embedding(x))))
        return torch.matmul(x, self.embedding.weight.t())


def _build_optimizer(model, kind):
    if kind == "adam":
        return torch.optim.AdamW(model.parameters(), lr=0.001, weight_decay=0.00001)
    return torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)  # Paddle's Momentum (momentum=0.9)


def _train_batch(batch, model, optimizer):
    loss = model(batch).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def _sharding_model(kind, data):
    np_fc1, np_fc2 = np.random.random_sample((HIDDEN, INNER)), np.random.random_sample((INNER, HIDDEN))
    model_a, model_b = SimpleDPNet(np_fc1, np_fc2), SimpleDPNet(np_fc1, np_fc2)
    optimizer_a, optimizer_b = _build_optimizer(model_a, kind), _build_optimizer(model_b, kind)
    optimizer_a._grad_clip = ClipGradByGlobalNorm(0.5)  # Paddle's grad_clip=, on both optimizers
    model_a, optimizer_a = fleet.distributed_model(model_a), fleet.distributed_optimizer(optimizer_a)
    rank = tdist.get_rank()
    diffs, held, norms = [], None, []
    for idx in range(STEPS):
        if idx == 2:  # which parameters the inner (sharded) optimizer keeps state for, on each rank
            inner = optimizer_a.inner_opt  # Paddle's optimizer_a._inner_opt: the sharding optimizer
            local = getattr(inner, "optim", inner)  # its ._inner_opt: the optimizer over this rank's shard
            held = (type(inner).__name__, [i for i, p in enumerate(model_a.parameters()) if p in local.state])
        batch_sharding = torch.from_numpy(data[idx][:2] if rank == 0 else data[idx][2:])
        _train_batch(batch_sharding, model_a, optimizer_a)
        loss_b = model_b(torch.from_numpy(data[idx])).mean()
        loss_b.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model_b.parameters(), 0.5).detach())
        optimizer_b.step()
        optimizer_b.zero_grad()
        diffs.append([(a.detach().clone(), b.detach().clone())
                      for a, b in zip(model_a.parameters(), model_b.parameters())])
    return diffs, held, torch.stack(norms)


def _sharding2(rank, world):
    random.seed(2021)
    np.random.seed(2021)
    torch.manual_seed(2021)
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"sharding_degree": 2, "dp_degree": 1, "mp_degree": 1, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    data = [np.random.randint(0, VOCAB, (BATCH, SEQ)) for _ in range(STEPS)]
    return {kind: _sharding_model(kind, data) for kind in ("adam", "momentum")}


@pytest.mark.timeout(200)
def test_paddle_sharding_model_adam_and_momentum_on_two_ranks():
    results = run_ranks(_sharding2, world_size=2, timeout=190)
    for kind in ("adam", "momentum"):
        held = []
        for r in results:
            steps, (cls, params), norms = r[kind]
            for step in steps:
                for a, b in step:
                    torch.testing.assert_close(a, b, rtol=1e-6, atol=0)  # Paddle: rtol=1e-6
            assert "Zero" in cls or "Sharding" in cls, cls  # the inner optimizer is a sharded one
            assert norms.max() > 0.5, norms  # the clip acts
            held.append(set(params))
        assert held[0] and held[1] and not held[0] & held[1], held  # each rank its own shard, disjoint
        assert held[0] | held[1] == set(range(7)), held  # SimpleDPNet's seven parameters
