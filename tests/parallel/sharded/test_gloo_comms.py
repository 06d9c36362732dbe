"""FSDP2's collectives done as gloo all-reduces (Note [gloo sharded collectives]) give what torch's own
all_gather / reduce_scatter give, bit for bit, on 2 and 4 real ranks, including FSDP2's in-place all-gather
(the input is this rank's slot of the output); and ShardedDataParallel installs them on gloo groups."""

import pytest
import torch
import torch.distributed as dist

from fleetlite.parallel.sharded.gloo_comms import GlooAllGather, GlooReduceScatter
from fleetlite.testing import run_ranks


def _compare(rank, world):
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(rank)
    n = 1000
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        shard = (torch.randn(n, generator=g) * 100).to(dtype)
        expected = torch.empty(n * world, dtype=dtype)
        dist.all_gather_into_tensor(expected, shard)
        ours = torch.full((n * world,), 7, dtype=dtype)  # stale contents must not leak in
        GlooAllGather()(ours, shard, dist.group.WORLD, async_op=True).wait()
        in_place = torch.full((n * world,), 7, dtype=dtype)
        in_place[rank * n:(rank + 1) * n].copy_(shard)  # FSDP2's layout: the input is a view of the output
        GlooAllGather()(in_place, in_place[rank * n:(rank + 1) * n], dist.group.WORLD)
        out[f"ag {dtype}"] = torch.equal(ours, expected) and torch.equal(in_place, expected)
    grads = torch.randn(n * world, generator=g)
    expected = torch.empty(n)
    dist.reduce_scatter_tensor(expected, grads.clone())
    ours = GlooReduceScatter().allocate((n,), dtype=torch.float32, device=torch.device("cpu"))
    GlooReduceScatter()(ours, grads.clone(), dist.group.WORLD, dist.ReduceOp.SUM)
    # two ranks: one addition, the same either way; more ranks may sum in another order (within rounding)
    out["rs"] = torch.equal(ours, expected) if world == 2 else torch.allclose(ours, expected, rtol=0, atol=1e-5)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_gloo_collectives_match_torch(world):
    for result in run_ranks(_compare, world_size=world, timeout=100):
        assert all(result.values()), result


def _installed(rank, world):
    from fleetlite.parallel.sharded import ShardedDataParallel

    torch.manual_seed(0)
    model = ShardedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)), stage=2)
    return model.gloo_comms


@pytest.mark.timeout(90)
def test_sharded_model_uses_them_on_gloo():
    assert run_ranks(_installed, world_size=2, timeout=80) == [True, True]
