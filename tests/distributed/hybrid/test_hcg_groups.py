"""HybridCommunicateGroup's remaining Paddle accessors: ``create_fuse_group``, the p2p neighbours and the
four-direction p2p groups, the sharding check group, and Paddle's hybrid_parallel_communicate_group.py test
(an HCG built directly on a 4-axis topology, collectives over its dp group)."""

import pytest
import torch
import torch.distributed as tdist
from hybrid_models import init_fleet

import fleetlite.distributed.fleet as fleet
from fleetlite.testing import run_ranks


def _ranks(group):
    return tdist.get_process_group_ranks(group)


def _sum(group, value):
    t = torch.tensor([float(value)])
    tdist.all_reduce(t, group=group)
    return t.item()


def _pp_mp(rank, world):
    hcg = init_fleet({"dp_degree": 1, "pp_degree": 2, "mp_degree": 2})
    pp_mp_ranks, pp_mp = hcg.create_fuse_group(["pipe", "model"])
    dp_pp_ranks, dp_pp = hcg.create_fuse_group(["data", "pipe"])
    errors = []
    for call in (hcg.get_p2p_groups, hcg.get_pp_mp_parallel_group, hcg.get_dp_sep_parallel_group):
        try:
            call()
        except RuntimeError as e:
            errors.append(str(e).splitlines()[0])
    try:
        hcg.create_fuse_group(["pipe", "tensor"])
    except ValueError as e:
        errors.append(str(e))
    return dict(next=hcg._get_p2p_next_rank(), prev=hcg._get_p2p_prev_rank(), pp_mp=(pp_mp_ranks, _ranks(pp_mp)),
                pp_mp_sum=_sum(pp_mp, rank), dp_pp=(dp_pp_ranks, _sum(dp_pp, rank)), valid=hcg._check_valid_topo(),
                sharding_check=_ranks(hcg.get_check_parallel_group(sharding=True)),
                src=(hcg.get_model_parallel_group_src_rank(), hcg.get_pipe_parallel_group_src_rank(),
                     hcg.get_sharding_parallel_group_src_rank()), errors=errors)


@pytest.mark.timeout(200)
def test_pp2_mp2_fused_groups_and_p2p_neighbours_on_four_ranks():
    out = run_ranks(_pp_mp, world_size=4, timeout=190)
    for rank, r in enumerate(out):  # order dp, pp, sharding, sep, mp: rank = 2 * stage + mp
        stage, mp = rank // 2, rank % 2
        other = (1 - stage) * 2 + mp  # the other stage of this pipeline
        assert r["next"] == r["prev"] == other  # Paddle wraps around: with 2 stages both neighbours are the other
        assert r["pp_mp"] == ([0, 1, 2, 3], [0, 1, 2, 3]) and r["pp_mp_sum"] == 6
        assert r["dp_pp"] == ([mp, mp + 2], 2 * mp + 2)
        assert r["valid"] and r["sharding_check"] == [0, 1, 2, 3]  # sharding 1: every rank has coordinate 0
        assert r["src"] == (2 * stage, mp, rank)
        assert "PADDLE_USE_FOUR_DIRECTIONS_P2P" in r["errors"][0]
        assert "sep_degree > 1" in r["errors"][1] and "sep_degree > 1" in r["errors"][2]
        assert "unknown parallel axis 'tensor'" in r["errors"][3]


def _four_directions(rank, world):
    hcg = init_fleet({"dp_degree": 1, "pp_degree": 2})
    send_next, send_prev, recv_next, recv_prev = hcg.get_p2p_groups()
    # the stage-0 -> stage-1 pair: stage 0 sends on send_next, stage 1 receives on recv_prev
    t = torch.tensor([float(rank + 1)])
    tdist.broadcast(t, src=0, group=send_next if rank == 0 else recv_prev)
    return t.item(), [_ranks(g) for g in (send_next, send_prev, recv_next, recv_prev)]


@pytest.mark.timeout(120)
def test_four_direction_p2p_groups_with_paddles_switch():
    out = run_ranks(_four_directions, world_size=2, env={"PADDLE_USE_FOUR_DIRECTIONS_P2P": "1"}, timeout=110)
    for value, groups in out:
        assert value == 1.0 and groups == [[0, 1]] * 4


def _paddle_communicate_group(rank, world):
    """Paddle's test/collective/fleet/hybrid_parallel_communicate_group.py, in torch's collectives."""
    topo = fleet.CommunicateTopology(["data", "model", "sharding", "pipe"], [2, 1, 1, 1])
    hcg = fleet.HybridCommunicateGroup(topo)
    t1, t2 = torch.tensor([1, 2, 3]), torch.tensor([2, 3, 4])
    dp_gp, dp_src = hcg.get_data_parallel_group(), hcg.get_data_parallel_group_src_rank()
    assert hcg.get_data_parallel_world_size() == 2 and dp_src == 0 and hcg.get_model_parallel_world_size() == 1
    result = torch.zeros(3, dtype=torch.int64)
    tdist.scatter(result, [t2, t1] if rank == dp_src else None, src=dp_src, group=dp_gp)
    scattered = result.clone()
    tdist.broadcast(result, src=1, group=dp_gp)
    broadcast = result.clone()
    tdist.reduce(result, dst=dp_src, group=dp_gp)
    reduced = result.clone()
    if rank != dp_src:  # torch leaves a non-destination buffer undefined (gloo writes partial sums in it)
        result, reduced = broadcast.clone(), broadcast.tolist()
    tdist.all_reduce(result)
    gathered = [torch.zeros(3, dtype=torch.int64) for _ in range(2)]
    tdist.all_gather(gathered, t1, group=dp_gp)
    tdist.barrier(group=dp_gp)
    reduced = reduced.tolist() if torch.is_tensor(reduced) else reduced
    return scattered.tolist(), broadcast.tolist(), reduced, result.tolist(), [g.tolist() for g in gathered]


def test_paddles_communicate_group_test_on_a_directly_built_hcg():
    for rank, (scattered, broadcast, reduced, summed, gathered) in enumerate(
            run_ranks(_paddle_communicate_group, world_size=2, timeout=110)):
        assert scattered == ([2, 3, 4] if rank == 0 else [1, 2, 3]) and broadcast == [1, 2, 3]
        assert reduced == ([2, 4, 6] if rank == 0 else [1, 2, 3]) and summed == [3, 6, 9]
        assert gathered == [[1, 2, 3], [1, 2, 3]]
