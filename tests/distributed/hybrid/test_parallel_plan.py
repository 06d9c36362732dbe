"""The ParallelPlan: the hybrid degrees and their checks against Paddle's rule worked by hand, and its named
groups against Paddle's topology arithmetic (ranks row-major over ``hybrid_configs['order']``), computed here
independently with numpy, on 4 real gloo ranks, every rank checked."""

import numpy as np
import pytest
import torch
import torch.distributed as tdist

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.base import topology as topo_mod
from fleetlite.distributed.fleet.data_group import data_group
from fleetlite.distributed.fleet.meta_parallel.sharded_state import _mesh_of
from fleetlite.distributed.fleet.plan import ParallelPlan
from fleetlite.testing import run_ranks

PADDLE_ORDER = ["dp", "pp", "sharding", "sep", "mp"]
#: what each named group spans (the issue's definitions, Paddle's check groups)
SPANS = {"data": {"dp", "sharding"}, "loss": {"dp", "sharding", "sep"}, "model": {"pp", "sep", "mp"},
         "replica": {"pp", "sep", "mp"}, "check": {"pp", "sharding", "sep", "mp"},
         "sharding_check": {"dp", "pp", "sep", "mp"}, **{a: {a} for a in PADDLE_ORDER}}


def _configs(order=PADDLE_ORDER, **degrees):
    base = {"dp_degree": -1, "pp_degree": 1, "sharding_degree": 1, "sep_degree": 1, "mp_degree": 1}
    return {**base, **{f"{k}_degree": v for k, v in degrees.items()}, "order": list(order)}


def expected_ranks(degrees, order, rank, span):
    """Paddle's layout: ranks are arange(world) reshaped to the degrees in ``order`` (row-major); a group holds the
    ranks that share this rank's coordinates on every axis outside ``span``."""
    world = int(np.prod([degrees[a] for a in order]))
    grid = np.arange(world).reshape([degrees[a] for a in order])
    coord = np.argwhere(grid == rank)[0]
    index = tuple(slice(None) if a in span else int(c) for a, c in zip(order, coord))
    return sorted(int(r) for r in grid[index].ravel())


@pytest.mark.parametrize("world, degrees, expected", [
    (8, {"mp": 2, "pp": 2}, {"dp": 2, "pp": 2, "sharding": 1, "sep": 1, "mp": 2}),
    (16, {"pp": 2, "sharding": 2, "mp": 2}, {"dp": 2, "pp": 2, "sharding": 2, "sep": 1, "mp": 2}),
    (8, {"sep": 2, "mp": 2}, {"dp": 2, "pp": 1, "sharding": 1, "sep": 2, "mp": 2}),
    (4, {"dp": 4}, {"dp": 4, "pp": 1, "sharding": 1, "sep": 1, "mp": 1}),
    (1, {}, {"dp": 1, "pp": 1, "sharding": 1, "sep": 1, "mp": 1}),
])
def test_degrees_follow_paddles_rule(world, degrees, expected):
    # Paddle: dp_degree = world / (pp * sharding * sep * mp) when left at -1
    plan = ParallelPlan.from_configs(_configs(**degrees), world)
    assert plan.degrees == expected and (plan.dp, plan.pp, plan.sharding, plan.sep, plan.mp) == tuple(
        expected[a] for a in PADDLE_ORDER)
    assert plan.world_size == world and plan.order == tuple(PADDLE_ORDER)
    assert (plan.dp_enabled, plan.pp_enabled, plan.sharding_enabled, plan.sep_enabled, plan.mp_enabled) == tuple(
        expected[a] > 1 for a in PADDLE_ORDER)
    assert plan.hybrid == (expected["mp"] > 1 or expected["pp"] > 1 or expected["sep"] > 1)
    assert plan.data_size == expected["dp"] * expected["sharding"]
    assert plan.checkpoint_degrees == {"dp": world // (expected["mp"] * expected["pp"]), "mp": expected["mp"],
                                       "pp": expected["pp"]}
    # the strategy's public front gives the same degrees
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {f"{k}_degree": v for k, v in degrees.items()}
    assert strategy.hybrid_degrees(world) == expected


@pytest.mark.parametrize("world, configs, match", [
    (2, _configs(mp=4), "mp 4 x pp 1 x sharding 1 x sep 1 = 4 do not divide the 2 ranks"),
    (2, _configs(dp=2, mp=2), "hybrid_configs['dp_degree'] = 2 does not fit 2 ranks"),
    (8, _configs(dp=3, mp=2), "it must be 4 or -1"),
    (4, _configs(order=["dp", "pp", "sharding", "sep"], mp=2), "leaves out 'mp' whose degree is 2"),
])
def test_degrees_that_do_not_fit_fail_in_one_line(world, configs, match):
    with pytest.raises(ValueError) as info:
        ParallelPlan.from_configs(configs, world)
    assert match in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("degrees, order", [
    ({"dp": 2, "pp": 2, "sharding": 2, "sep": 1, "mp": 2}, PADDLE_ORDER),
    ({"dp": 2, "pp": 1, "sharding": 2, "sep": 2, "mp": 2}, ["mp", "sep", "sharding", "pp", "dp"]),
    ({"dp": 1, "pp": 2, "sharding": 2, "sep": 2, "mp": 2}, ["sharding", "mp", "dp", "sep", "pp"]),
])
def test_rank_arithmetic_of_every_rank_matches_paddles_layout(degrees, order):
    world = int(np.prod(list(degrees.values())))
    for rank in range(world):
        plan = ParallelPlan(degrees, order, world, rank=rank)
        for name, span in SPANS.items():
            assert plan.ranks(name) == expected_ranks(degrees, order, rank, span), (rank, name)
        grid = np.arange(world).reshape([degrees[a] for a in order])
        assert tuple(plan.coord[a] for a in order) == tuple(int(c) for c in np.argwhere(grid == rank)[0])
        assert plan.data_rank == plan.coord["dp"] * degrees["sharding"] + plan.coord["sharding"]


def test_get_parallel_plan_before_init_says_call_init(clean_dist_env):
    fleet_impl._reset()
    with pytest.raises(RuntimeError, match=r"fleet.get_parallel_plan was called before fleet.init\(\)"):
        fleet.get_parallel_plan()


def _groups(plan):
    out = {}
    for name in SPANS:
        group = plan.group(name)
        t = torch.tensor([float(tdist.get_rank())])
        tdist.all_reduce(t, group=group)  # the group really communicates over these ranks
        out[name] = (sorted(tdist.get_process_group_ranks(group)), t.item())
    return out


#: layouts made by fleet.init (strategy) and by hand (sep: fleet refuses sep_degree until its axis runs)
LAYOUTS = [
    ("init", {"dp_degree": 2, "mp_degree": 2}),
    ("init", {"pp_degree": 2, "sharding_degree": 2}),
    ("init", {"mp_degree": 2, "sharding_degree": 2, "order": ["mp", "sharding", "pp", "sep", "dp"]}),
    ("plan", ({"sep": 2, "mp": 2}, PADDLE_ORDER)),
    ("plan", ({"dp": 2, "sep": 2}, ["sep", "pp", "sharding", "mp", "dp"])),
]


def _plan_on_ranks(rank, world):
    results = []
    for kind, spec in LAYOUTS:
        fleet_impl._reset()
        if kind == "init":
            strategy = fleet.DistributedStrategy()
            strategy.hybrid_configs = spec
            fleet.init(is_collective=True, strategy=strategy)
            plan = fleet.get_parallel_plan()
            hcg = fleet.get_hybrid_communicate_group()
        else:
            hcg = fleet.HybridCommunicateGroup(fleet.CommunicateTopology(
                [topo_mod.AXIS_OF[a] for a in spec[1]], [spec[0].get(a, 1) for a in spec[1]]))
            plan = hcg.plan
        mp_mesh = plan.submesh("mp")
        agree = dict(
            mesh=hcg.mesh is plan.mesh and plan.mesh is not None,
            singleton=topo_mod.get_hybrid_communicate_group() is hcg and topo_mod._HYBRID_PARALLEL_GROUP is hcg,
            groups=(hcg.get_data_parallel_group() is plan.group("dp")
                    and hcg.get_model_parallel_group() is plan.group("mp")
                    and hcg.get_pipe_parallel_group() is plan.group("pp")
                    and hcg.get_sharding_parallel_group() is plan.group("sharding")
                    and hcg.get_sep_parallel_group() is plan.group("sep")
                    and hcg.get_data_sharding_parallel_group() is plan.group("data")
                    and hcg._get_replica_group() is plan.group("replica")
                    and hcg.get_check_parallel_group() is plan.group("check")
                    and hcg.get_check_parallel_group(sharding=True) is plan.group("sharding_check")),
            ranks=(hcg.get_data_parallel_rank(), hcg.get_stage_id(), hcg.get_sharding_parallel_rank(),
                   hcg.get_sep_parallel_rank(), hcg.get_model_parallel_rank()),
            data_rank=(hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()),
            one_mp_mesh=mp_mesh is plan.submesh("mp") and _mesh_of(plan.group("mp"), {}, "cpu") is mp_mesh,
            mp_mesh=mp_mesh.mesh.tolist(), mesh_names=plan.mesh.mesh_dim_names, mesh_shape=tuple(plan.mesh.shape),
            hsdp=(plan.submesh("sharding", "dp") is plan.submesh("dp", "sharding"),
                  plan.submesh("dp", "sharding").mesh_dim_names, plan.submesh("dp", "sharding").mesh.tolist()),
        )
        if kind == "init":
            agree["fleet"] = fleet.get_hybrid_communicate_group() is hcg and fleet_impl._state.plan is plan
            g = data_group()
            agree["data_group"] = (g.rank, g.size, g.group is plan.group("data")) if g.hybrid else None
        results.append((dict(plan.degrees), list(plan.order), _groups(plan), agree))
    return results


@pytest.mark.timeout(400)
def test_named_groups_hold_paddles_ranks_on_four_ranks():
    out = run_ranks(_plan_on_ranks, world_size=4, timeout=390)
    for rank, results in enumerate(out):
        for (kind, spec), (degrees, order, groups, agree) in zip(LAYOUTS, results):
            if kind == "init":
                want = {a: spec.get(f"{a}_degree", 1) for a in PADDLE_ORDER}
                want["dp"] = 4 // (want["pp"] * want["sharding"] * want["sep"] * want["mp"])
                want_order = list(spec.get("order", PADDLE_ORDER))
            else:
                want = {a: spec[0].get(a, 1) for a in PADDLE_ORDER}
                want_order = list(spec[1])
            assert degrees == want and order == want_order, (rank, spec)
            for name, span in SPANS.items():
                ranks = expected_ranks(want, order, rank, span)
                assert groups[name] == (ranks, float(sum(ranks))), (rank, spec, name, groups[name])
            coord = np.argwhere(np.arange(4).reshape([want[a] for a in order]) == rank)[0]
            by_axis = dict(zip(order, (int(c) for c in coord)))
            assert agree["ranks"] == tuple(by_axis[a] for a in PADDLE_ORDER), (rank, spec)
            assert agree["data_rank"] == (by_axis["dp"] * want["sharding"] + by_axis["sharding"],
                                          want["dp"] * want["sharding"])
            assert agree["mesh"] and agree["singleton"] and agree["groups"] and agree["one_mp_mesh"], (rank, agree)
            assert agree["mp_mesh"] == expected_ranks(want, order, rank, {"mp"})
            assert agree["mesh_names"] == tuple(order) and agree["mesh_shape"] == tuple(want[a] for a in order)
            # FSDP2's replicate x shard mesh: the dp and sharding dimensions of the same mesh, in its order
            grid = np.arange(4).reshape([want[a] for a in order])
            keep = tuple(slice(None) if a in ("dp", "sharding") else by_axis[a] for a in order)
            names = tuple(a for a in order if a in ("dp", "sharding"))
            assert agree["hsdp"] == (True, names, grid[keep].tolist()), (rank, spec, agree["hsdp"])
            if kind == "init":
                assert agree["fleet"], (rank, spec)
                hybrid = want["mp"] > 1 or want["pp"] > 1
                part = by_axis["dp"] * want["sharding"] + by_axis["sharding"]  # PaddleNLP's dataset_rank
                assert agree["data_group"] == ((part, want["dp"] * want["sharding"], True) if hybrid else None), agree
