"""The one gradient rule (Note [one gradient rule]): the global norm of gradients split over mp, pp (a tied
weight), mp × dp, sharding stage 2 beside mp and FSDP2 (alone and beside mp) equals the norm of the one-process
model's full gradients (``torch.linalg.vector_norm``), and clipping by it equals ``torch.nn.utils.clip_grad_norm_``
on the full gradients, on every rank; a NaN gradient on one rank gives a NaN norm on all."""

import math
from types import SimpleNamespace

import pytest
import torch
from hybrid_models import init_fleet, run_cases
from torch import nn

from fleetlite.distributed.fleet.gradients import GradGroups, average_gradients, clip_by_global_norm, global_norm
from fleetlite.distributed.fleet.meta_parallel.hybrid_clip import clip_grad_norm_hybrid, global_norm_hybrid
from fleetlite.distributed.fleet.meta_parallel.hybrid_sharding import GRAD_GROUP_ATTR, PARTITION_ATTR
from fleetlite.testing import run_ranks

NORMS = (2.0, 3.0, math.inf)
# name -> (full shape, split axis under mp or None for replicated)
LAYOUT = {"emb": ((8, 4), 0), "up": ((6, 4), 0), "down": ((4, 6), 1), "bias": ((4,), None), "scale": ((4,), None)}


def _full_grads():
    """The one-process model's gradients (the same on every rank: seeded), some large so clipping bites."""
    g = torch.Generator().manual_seed(7)
    return {k: torch.randn(shape, generator=g) * (1 + i) for i, (k, (shape, _)) in enumerate(LAYOUT.items())}


def _reference(full, max_norm):
    """(norms by type, clipped full gradients) from torch's own functions over the full gradients."""
    flat = torch.cat([t.reshape(-1) for t in full.values()])
    norms = {p: torch.linalg.vector_norm(flat, p) for p in NORMS}
    params = {k: nn.Parameter(torch.zeros_like(t)) for k, t in full.items()}
    for k, p in params.items():
        p.grad = full[k].clone()
    total = torch.nn.utils.clip_grad_norm_(list(params.values()), max_norm)
    torch.testing.assert_close(total, norms[2.0])
    return norms, {k: p.grad for k, p in params.items()}


def _slice(t, axis, rank, parts):
    return t if axis is None else t.chunk(parts, dim=axis)[rank].clone()


def _mp_params(full, names, mp_rank, mp):
    """This mp rank's parameters: slices tagged ``split_axis`` (as the tensor-parallel layers tag them), replicated
    ones whole; each with its gradient."""
    out = {}
    for k in names:
        axis = LAYOUT[k][1]
        p = nn.Parameter(torch.zeros_like(_slice(full[k], axis, mp_rank, mp)))
        if axis is not None:
            p.split_axis = axis
        p.grad = _slice(full[k], axis, mp_rank, mp)
        out[k] = p
    return out


def _check_norms(params, groups, ref_norms):
    got = {p: global_norm(params, groups, p) for p in NORMS}
    for p in NORMS:
        torch.testing.assert_close(got[p], ref_norms[p].float(), rtol=1e-6, atol=1e-6)
    return {p: float(v) for p, v in got.items()}


def _mp(rank, world, degrees):
    hcg = init_fleet(degrees)
    mp_rank, mp = hcg.get_model_parallel_rank(), hcg.get_model_parallel_world_size()
    full = _full_grads()
    ref_norms, ref_clipped = _reference(full, max_norm=3.0)
    params = _mp_params(full, LAYOUT, mp_rank, mp)
    groups = GradGroups.of(hcg)
    norms = _check_norms(list(params.values()), groups, ref_norms)
    torch.testing.assert_close(global_norm_hybrid(params.values(), hcg), ref_norms[2.0], rtol=1e-6, atol=1e-6)
    total = clip_by_global_norm(list(params.values()), 3.0, groups)
    torch.testing.assert_close(total, ref_norms[2.0], rtol=1e-6, atol=1e-6)
    for k, p in params.items():
        torch.testing.assert_close(p.grad, _slice(ref_clipped[k], LAYOUT[k][1], mp_rank, mp), rtol=1e-6, atol=1e-6)
    return norms


@pytest.fixture(scope="module")
def mp2():
    """Every rank's results of the mp2 runs of this file (and the plain average over the same two ranks), by name:
    one 2-rank launch for the module."""
    cases = {"mp": (_mp, ({"mp_degree": 2},), {}), "nan": (_nan, (), {}), "average": (_average, (), {})}
    return run_ranks(run_cases, world_size=2, args=(cases,), timeout=300)


@pytest.mark.timeout(400)
def test_mp2_global_norm_and_clip_equal_the_full_models(mp2):
    ref = {p: float(v) for p, v in _reference(_full_grads(), 3.0)[0].items()}
    for r in (out["mp"] for out in mp2):
        assert r == pytest.approx(ref, rel=1e-6), r


@pytest.mark.timeout(200)
def test_mp2_dp2_counts_replicas_once_on_four_ranks():
    """Data-parallel replicas hold the same averaged gradients: nothing is added over dp (twice the sum would fail)."""
    ref = {p: float(v) for p, v in _reference(_full_grads(), 3.0)[0].items()}
    for r in run_ranks(_mp, world_size=4, args=({"dp_degree": 2, "mp_degree": 2},), timeout=190):
        assert r == pytest.approx(ref, rel=1e-6), r


def _pp_tied(rank, world):
    """Stage 0 holds emb (the tied weight's first holder) and up; stage 1 holds emb's copy, down, bias, scale."""
    hcg = init_fleet({"pp_degree": 2})
    stage = hcg.get_stage_id()
    full = _full_grads()
    ref_norms, ref_clipped = _reference(full, max_norm=3.0)
    names = ["emb", "up"] if stage == 0 else ["emb", "down", "bias", "scale"]
    params = {k: nn.Parameter(torch.zeros_like(full[k])) for k in names}
    for k, p in params.items():
        p.grad = full[k].clone()  # the tied weight's gradient is already summed over its stages
    params["emb"].is_firstly_shared = stage == 0
    norms = _check_norms(list(params.values()), GradGroups.of(hcg), ref_norms)
    clip_grad_norm_hybrid(list(params.values()), 3.0, hcg)  # Paddle's HybridParallelClipGrad path
    for k, p in params.items():
        torch.testing.assert_close(p.grad, ref_clipped[k], rtol=1e-6, atol=1e-6)
    return norms


@pytest.mark.timeout(120)
def test_pp2_with_a_tied_weight_counts_it_once():
    ref = {p: float(v) for p, v in _reference(_full_grads(), 3.0)[0].items()}
    for r in run_ranks(_pp_tied, world_size=2, timeout=110):
        assert r == pytest.approx(ref, rel=1e-6), r


def _stage2_mp(rank, world):
    """mp2 × sharding2, stage 2: each parameter's gradient lives on its owner (the others None)."""
    hcg = init_fleet({"mp_degree": 2, "sharding_degree": 2}, sharding=True, sharding_configs={"stage": 2})
    mp_rank, sh_rank, sh_group = (hcg.get_model_parallel_rank(), hcg.get_sharding_parallel_rank(),
                                  hcg.get_sharding_parallel_group())
    full = _full_grads()
    ref_norms, ref_clipped = _reference(full, max_norm=3.0)
    params = _mp_params(full, LAYOUT, mp_rank, 2)
    owner = {p: i % 2 for i, p in enumerate(params.values())}
    zero = SimpleNamespace(_param_to_rank=owner)  # the ZeroRedundancyOptimizer's partition, as it marks them
    for p in params.values():
        setattr(p, GRAD_GROUP_ATTR, sh_group)
        setattr(p, PARTITION_ATTR, zero)
        if owner[p] != sh_rank:
            p.grad = None
    owned = [p for p in params.values() if owner[p] == sh_rank]
    norms = _check_norms(owned, GradGroups.of(hcg, sharding=sh_group), ref_norms)
    clip_grad_norm_hybrid(params.values(), 3.0, hcg)  # finds the owners itself (Note [hybrid global norm])
    for k, p in params.items():
        if owner[p] == sh_rank:
            torch.testing.assert_close(p.grad, _slice(ref_clipped[k], LAYOUT[k][1], mp_rank, 2), rtol=1e-6,
                                       atol=1e-6)
        else:
            assert p.grad is None, k
    return norms


@pytest.mark.timeout(200)
def test_sharding_stage2_beside_mp_adds_the_owners_once():
    ref = {p: float(v) for p, v in _reference(_full_grads(), 3.0)[0].items()}
    for r in run_ranks(_stage2_mp, world_size=4, timeout=190):
        assert r == pytest.approx(ref, rel=1e-6), r


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 7), nn.Linear(7, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _fsdp(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    ref = _Net()
    model = _Net()
    model.load_state_dict(ref.state_dict())
    mesh = init_device_mesh("cpu", (world,))
    for m in (model.a, model.b, model):
        fully_shard(m, mesh=mesh)
    xs = torch.randn(world, 4, 5, generator=torch.Generator().manual_seed(1)) * 3
    model(xs[rank]).pow(2).sum().backward()  # FSDP2 averages over the ranks
    for x in xs:  # the one-process model: the mean of the ranks' gradients
        (ref(x).pow(2).sum() / world).backward()
    ref_grads = [p.grad.reshape(-1) for p in ref.parameters()]
    ref_norms = {p: torch.linalg.vector_norm(torch.cat(ref_grads), p) for p in NORMS}
    assert all(hasattr(p.grad, "placements") for p in model.parameters())  # DTensor gradients
    norms = _check_norms(list(model.parameters()), None, ref_norms)  # the mesh's group from the DTensors
    max_norm = float(ref_norms[2.0]) / 4
    total = clip_by_global_norm(model.parameters(), max_norm)
    ref_total = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
    torch.testing.assert_close(total, ref_total, rtol=1e-6, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-6, atol=1e-6)
    return norms


@pytest.mark.timeout(150)
def test_fsdp2_sharded_gradients_norm_and_clip_like_one_process():
    for r in run_ranks(_fsdp, world_size=2, timeout=140):
        assert all(math.isfinite(v) and v > 0 for v in r.values()), r


class _MpSlice(nn.Module):
    """``up``'s rows of this mp rank (a column-parallel slice) and a replicated bias; the loss of the full model is
    the sum of the slices' terms plus the bias term once (which every mp rank computes whole)."""

    def __init__(self, weight, bias):
        super().__init__()
        self.weight, self.bias = nn.Parameter(weight.clone()), nn.Parameter(bias.clone())

    def forward(self, x):
        return (x @ self.weight.T).pow(2).sum() + (self.bias * x.sum(0)).sum()


def _fsdp_mp(rank, world):
    """FSDP2 on the dp axis beside mp2 (4 ranks): DTensor gradients of tensor-parallel slices."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "mp"))
    dp_rank, mp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("mp")
    g = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(8, 5, generator=g), torch.randn(5, generator=g)
    xs = torch.randn(2, 4, 5, generator=g)
    model = _MpSlice(weight.chunk(2)[mp_rank], bias)
    fully_shard(model, mesh=mesh["dp"])
    model.weight.split_axis = 0  # tagged as the tensor-parallel layers tag a slice
    model(xs[dp_rank]).backward()
    full = _MpSlice(weight, bias)
    for x in xs:
        (full(x) / 2).backward()
    ref_norms = {p: torch.linalg.vector_norm(torch.cat([full.weight.grad.reshape(-1), full.bias.grad]), p)
                 for p in NORMS}
    norms = _check_norms(list(model.parameters()), GradGroups(model=mesh.get_group("mp")), ref_norms)
    max_norm = float(ref_norms[2.0]) / 5
    clip_by_global_norm(model.parameters(), max_norm, GradGroups(model=mesh.get_group("mp")))
    torch.nn.utils.clip_grad_norm_(full.parameters(), max_norm)
    torch.testing.assert_close(model.weight.grad.full_tensor(), full.weight.grad.chunk(2)[mp_rank], rtol=1e-6,
                               atol=1e-6)
    torch.testing.assert_close(model.bias.grad.full_tensor(), full.bias.grad, rtol=1e-6, atol=1e-6)
    return norms


@pytest.mark.timeout(200)
def test_fsdp2_beside_mp2_on_four_ranks():
    out = run_ranks(_fsdp_mp, world_size=4, timeout=190)
    for r in out:
        assert r == pytest.approx(out[0], rel=1e-6) and all(v > 0 for v in r.values()), r


def _nan(rank, world):
    hcg = init_fleet({"mp_degree": 2})
    params = _mp_params(_full_grads(), LAYOUT, rank, 2)
    if rank == 1:
        params["up"].grad[0, 0] = math.nan  # one element of one slice, on one rank
    groups = GradGroups.of(hcg)
    norms = {p: global_norm(list(params.values()), groups, p) for p in NORMS}
    clip_by_global_norm(list(params.values()), 1.0, groups)
    return {p: bool(v.isnan()) for p, v in norms.items()}, {k: bool(p.grad.isnan().all()) for k, p in params.items()}


@pytest.mark.timeout(400)
def test_a_nan_gradient_on_one_rank_gives_a_nan_norm_everywhere(mp2):
    for nan_norms, nan_grads in (out["nan"] for out in mp2):
        assert all(nan_norms.values()), nan_norms  # the max (inf) norm too: a MAX all-reduce alone drops a NaN
        assert all(nan_grads.values()), nan_grads  # as torch's clip_grad_norm_: NaN * coefficient


def _average(rank, world):
    """Every rank holds different gradients (one rank none for one parameter): all end with the mean."""
    ps = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2, 2, dtype=torch.float64)),
          nn.Parameter(torch.zeros(1))]
    ps[0].grad = torch.full((3,), float(rank + 1))
    ps[1].grad = torch.full((2, 2), 10.0 * (rank + 1), dtype=torch.float64)
    if rank == 0:
        ps[2].grad = torch.ones(1)
    average_gradients(ps, None, agree_missing=True)
    return [p.grad.tolist() for p in ps]


@pytest.mark.timeout(400)
def test_average_gradients_divides_then_sums_and_fills_missing(mp2):
    for r in (out["average"] for out in mp2):
        assert r == [[1.5] * 3, [[15.0, 15.0], [15.0, 15.0]], [0.5]], r
