"""Paddle's multi-node hybrid tests (test/collective/multinode/dygraph_hybrid_*.py), scaled from 16 GPUs
(``DP4-MP2-PP2``) to 4 gloo ranks: mp2 x pp2 (the pipeline branch of each test) and dp2 x mp2 (the tests' branch
without a pipeline, and dygraph_hybrid_dp.py's sum over the data-parallel group). Paddle's models, optimizer,
steps and tolerances; each rank's losses against ``Model(None)`` trained on one process.

- dygraph_hybrid_dpppmp.py: six column/row-parallel blocks between two plain linears, MSE, Adam(0.01), five
  steps, ``allclose(rtol=1e-5, atol=1e-5)``.
- dygraph_hybrid_recompute.py: the same with each block run through ``fleet.utils.recompute``.
- dygraph_hybrid_fp16.py: two steps under float16 with a distributed ``GradScaler(4096)``,
  ``allclose(rtol=1e-3, atol=1e-3)``. Paddle's ``amp.decorate(level='O2')`` (float16 weights, float32 master
  copies) has no torch counterpart: both sides run under ``torch.autocast(float16)`` with float32 weights, and
  the one-process reference scales its loss by the same 4096 (Paddle's steps unscaled: on CPU its float16
  gradients through twelve linears underflow, measured 1.4e-3 off at step 2, where the fp32 run gives 0.2993, the
  scaled hybrid 0.2997 and the unscaled reference 0.3011).
- dygraph_hybrid_dp.py: each dp rank's part of a float64 array, all-reduced, is the numpy sum (``rtol=1e-8``).

Paddle's weights are ``[in, out]``; torch's ``[out, in]``: the full Paddle weight is transposed into the full torch
weight and the tensor-parallel layers slice it themselves (Note [tensor-parallel parameters]).
"""

import numpy as np
import pytest
import torch
import torch.distributed as tdist
from torch import nn

import fleetlite.distributed as dist
import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet.utils import recompute
from fleetlite.testing import run_ranks

STEPS = {"dpppmp": 5, "recompute": 5, "fp16": 2}


def _weight_init(shape, seed):
    """Paddle's ``weight_init`` (the full weight; the layers slice it) as an initializer of torch's layout."""
    np.random.seed(seed)
    w = np.random.normal(0, 0.02, size=shape)
    return lambda t: t.copy_(torch.from_numpy(w.T))


def _linear(m, n, seed):
    """Paddle's plain ``nn.Linear(m, n, weight_attr=...)`` (zero bias, Paddle's default)."""
    layer = nn.Linear(m, n)
    with torch.no_grad():
        _weight_init((m, n), seed)(layer.weight), layer.bias.zero_()
    return layer


def _pair(mp, m, n, k, seed_1, seed_2):
    if mp is not None:
        return (fleet.meta_parallel.ColumnParallelLinear(m, n, weight_attr=_weight_init((m, n), seed_1),
                                                         has_bias=True, gather_output=False),
                fleet.meta_parallel.RowParallelLinear(n, k, weight_attr=_weight_init((n, k), seed_2),
                                                      has_bias=True, input_is_parallel=True))
    return _linear(m, n, seed_1), _linear(n, k, seed_2)


class RecomputeMatmulBlock(nn.Module):
    """dygraph_hybrid_recompute.py's block: recomputed under model parallelism."""

    def __init__(self, mp, seed, m, n, k):
        super().__init__()
        self.mp = mp
        self.layers = nn.Sequential(*_pair(mp, m, n, k, seed, seed + 1))

    def forward(self, x):
        return recompute(self.layers, x) if self.mp is not None else self.layers(x)


def _layers(mp, case):
    """``Model.layers_pp`` of each test. Paddle's ``Assign`` initialisers draw nothing while torch's ``nn.Linear``
    draws at construction, so the two generator-initialised linears are seeded before each is built."""
    torch.manual_seed(1024)
    width = 64 if case == "recompute" else 128
    layers = [nn.Linear(32, width)]
    for i in range(6):
        if case == "recompute":
            layers.append(nn.Sequential(RecomputeMatmulBlock(mp, 1024 + i, 64, 128, 64), nn.ReLU6()))
        else:
            layers.append(nn.Sequential(*_pair(mp, 128, 512, 128, 1204 + i, 2012 + i), nn.ReLU6()))
    torch.manual_seed(2048)
    layers.append(nn.Linear(width, 32))
    return layers


def _check_pass(case):
    """Each test's ``check_pass``: the hybrid model and ``Model(None)`` trained side by side on the same batch."""
    hcg = fleet.get_hybrid_communicate_group()
    mp = hcg.get_model_parallel_group() if hcg.get_model_parallel_world_size() > 1 else None
    crit = nn.MSELoss(reduction="mean")
    pp = hcg.get_pipe_parallel_world_size() > 1
    if pp:
        model = fleet.meta_parallel.PipelineLayer(layers=_layers(mp, case), loss_fn=crit, topology=hcg.topology())
    else:
        model = nn.Sequential(*_layers(mp, case))
    model_base = nn.Sequential(*_layers(None, case))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    optimizer_base = torch.optim.Adam(model_base.parameters(), lr=0.01)
    fp16 = case == "fp16"
    scaler = fleet.distributed_scaler(torch.amp.GradScaler("cpu", init_scale=4096)) if fp16 else None
    base_scaler = torch.amp.GradScaler("cpu", init_scale=4096)
    model, optimizer = fleet.distributed_model(model), fleet.distributed_optimizer(optimizer)
    rng = np.random.default_rng(7)  # the same batch on every rank, as Paddle's (its numpy state is seeded alike)
    x = torch.from_numpy(rng.random((16, 32))).float()
    y = torch.from_numpy(rng.random((16, 32))).float()
    loss_hybrid, loss_base = [], []
    for _ in range(STEPS[case]):
        with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
            if pp:
                loss = model.train_batch([x, y], optimizer=optimizer, scaler=scaler)
            else:
                loss = crit(model(x), y)
        if not pp:
            (scaler.scale(loss) if fp16 else loss).backward()
            if fp16:
                scaler.step(optimizer), scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
            base = crit(model_base(x), y)
        if fp16:  # Paddle's reference steps unscaled; here its float16 gradients underflow (module docstring)
            base_scaler.scale(base).backward()
            base_scaler.step(optimizer_base), base_scaler.update()
        else:
            base.backward()
            optimizer_base.step()
        optimizer_base.zero_grad()
        loss_base.append(base.detach().float())
        loss_hybrid.append(loss.detach().float())
    return torch.stack(loss_hybrid), torch.stack(loss_base)


def _dp_sum():
    """dygraph_hybrid_dp.py: rank ``r`` of the dp group holds ``data[r]``; their all-reduce is ``data.sum(0)``."""
    group = fleet.get_hybrid_communicate_group().get_data_parallel_group()
    nranks = group.size()
    np.random.seed(1024)
    data = np.random.random((10 * nranks, 100)).reshape((nranks, -1, 100))
    part = torch.from_numpy(data[tdist.get_rank(group)].copy())
    dist.all_reduce(part, group=group)  # Paddle: paddle.distributed.collective.all_reduce
    return part, torch.from_numpy(data.sum(axis=0))


def _run(rank, world, degrees):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = dict(degrees)
    strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": 8}
    fleet.init(is_collective=True, strategy=strategy)
    out = {case: _check_pass(case) for case in STEPS}
    if degrees["dp_degree"] > 1:
        out["dp_sum"] = _dp_sum()
    return out


def _check(results):
    for r in results:  # every rank's losses (on a pipeline, train_batch returns the loss on every stage)
        for case, tol in (("dpppmp", 1e-5), ("recompute", 1e-5), ("fp16", 1e-3)):
            hybrid, base = r[case]
            torch.testing.assert_close(hybrid, base, rtol=tol, atol=tol)
            assert torch.all(base[1:] < base[0]), case  # it trains


@pytest.mark.timeout(400)
def test_paddle_multinode_hybrid_mp2_pp2_on_four_ranks():
    _check(run_ranks(_run, world_size=4, args=({"dp_degree": 1, "mp_degree": 2, "pp_degree": 2},), timeout=390))


@pytest.mark.timeout(400)
def test_paddle_multinode_hybrid_dp2_mp2_on_four_ranks():
    results = run_ranks(_run, world_size=4, args=({"dp_degree": 2, "mp_degree": 2, "pp_degree": 1},), timeout=390)
    _check(results)
    for r in results:
        reduced, summed = r["dp_sum"]
        torch.testing.assert_close(reduced, summed, rtol=1e-8, atol=1e-8)  # Paddle: rtol=1e-8, atol=1e-8
