"""The parallel plan's apply order (Note [apply order]): which wrapper ``fleet.distributed_model`` gives a model
and which group holds the optimizer state, for a table of strategies, against Paddle's documented order, worked
here from Paddle's own source without fleetlite:

- ``python/paddle/distributed/fleet/model.py`` ``distributed_model`` wraps by
  ``HybridCommunicateGroup.get_parallel_mode()``: ``PIPELINE_PARALLEL`` -> ``PipelineParallel`` (the model must be a
  ``PipelineLayer``), ``TENSOR_PARALLEL`` -> ``TensorParallel``, ``SEGMENT_PARALLEL`` -> ``SegmentParallel``,
  ``SHARDING_PARALLEL`` -> ``ShardingParallel``, ``DATA_PARALLEL`` -> ``paddle.DataParallel``;
- ``python/paddle/distributed/fleet/base/topology.py`` ``get_parallel_mode`` (its comment: "pp -> mp -> sep ->
  sharding -> dp"), transcribed in :func:`paddle_parallel_mode`.

fleetlite's names for Paddle's: ``ShardingParallel`` is FSDP2 for stages 2 and 3 (``"sharded"``) and the
data-parallel engine with a sharded optimizer for stage 1 (``"data"``); sharding stage 3 beside tensor
parallelism is FSDP2 around it (``"tensor_stage3"``, torchtitan's 2-D FSDP + TP). Pure arithmetic: the plan's
``ranks`` need no process group.
"""

import pytest

from fleetlite.distributed.fleet.plan import AXES, ParallelPlan


def paddle_parallel_mode(dp, mp, pp, sharding, sep):
    """Paddle's ``HybridCommunicateGroup.get_parallel_mode`` (topology.py), condition for condition."""
    if pp == 1 and mp == 1 and sep == 1 and sharding == 1 and dp > 1:
        return "DATA_PARALLEL"
    elif pp == 1 and mp == 1 and sep == 1 and sharding > 1:
        return "SHARDING_PARALLEL"  # sharding may coexist with dp
    elif pp == 1 and mp == 1 and sep > 1:
        return "SEGMENT_PARALLEL"  # sep may coexist with dp and sharding
    elif pp == 1 and mp > 1:
        return "TENSOR_PARALLEL"  # tp may coexist with sep, dp and sharding
    elif pp > 1:
        return "PIPELINE_PARALLEL"  # pp may coexist with mp, sep, dp and sharding


#: Paddle's wrapper for each mode (fleet/model.py distributed_model), by sharding stage, in fleetlite's names
PADDLE_WRAPPER = {
    "DATA_PARALLEL": {0: "data", 1: "data", 2: "sharded", 3: "sharded"},  # (dp with sharding_configs alone)
    "SHARDING_PARALLEL": {1: "data", 2: "sharded", 3: "sharded"},
    "SEGMENT_PARALLEL": {0: "segment"},
    "TENSOR_PARALLEL": {0: "tensor", 1: "tensor", 2: "tensor", 3: "tensor_stage3"},
    "PIPELINE_PARALLEL": {0: "pipeline", 1: "pipeline", 2: "pipeline", 3: "pipeline"},
}

#: (name, degrees, sharding stage, world): the strategies of the issue's table
TABLE = [
    ("dp4", {"dp": 4}, 0, 4),
    ("dp2_sharding2_stage1", {"dp": 2, "sharding": 2}, 1, 4),
    ("sharding4_stage1", {"sharding": 4}, 1, 4),
    ("sharding4_stage2", {"sharding": 4}, 2, 4),
    ("sharding4_stage3", {"sharding": 4}, 3, 4),
    ("dp2_stage3", {"dp": 2}, 3, 2),  # sharding_configs over dp alone: FSDP2 over every rank
    ("mp2_dp2", {"dp": 2, "mp": 2}, 0, 4),
    ("pp2_dp2", {"dp": 2, "pp": 2}, 0, 4),
    ("sep2_dp2", {"dp": 2, "sep": 2}, 0, 4),
    ("mp2_sharding2_stage3", {"sharding": 2, "mp": 2}, 3, 4),
    ("pp2_sharding2_stage3", {"sharding": 2, "pp": 2}, 3, 4),
    ("pp2_mp2", {"pp": 2, "mp": 2}, 0, 4),
    ("pp2_mp2_dp2", {"dp": 2, "pp": 2, "mp": 2}, 0, 8),
    ("mp2_sharding2_stage2", {"sharding": 2, "mp": 2}, 2, 4),
    ("pp2_sharding2_stage1", {"sharding": 2, "pp": 2}, 1, 4),
]


def _plan(degrees, world, rank=0):
    return ParallelPlan(degrees, AXES, world, rank=rank)


def _paddle(degrees, stage):
    d = {a: degrees.get(a, 1) for a in AXES}
    return PADDLE_WRAPPER[paddle_parallel_mode(d["dp"], d["mp"], d["pp"], d["sharding"], d["sep"])][stage]


@pytest.mark.parametrize("name, degrees, stage, world", TABLE, ids=[row[0] for row in TABLE])
def test_the_wrapper_follows_paddles_order(name, degrees, stage, world):
    plan = _plan(degrees, world)
    want = _paddle(degrees, stage)
    assert plan.wrapper(stage) == want
    # the steps: the model-side strategies first (on this rank's stage for a pipeline), then the one wrapper
    stages = degrees.get("pp", 1) if want == "pipeline" else None
    before = "stage_strategies" if want == "pipeline" else "strategies"
    assert plan.apply_steps(stage, stages) == (before, want)


@pytest.mark.parametrize("name, degrees, stage, world", TABLE, ids=[row[0] for row in TABLE])
def test_every_rank_of_a_plan_gets_the_same_steps(name, degrees, stage, world):
    """The choice is the layout's, not the rank's (every rank wraps alike: no mismatched collectives)."""
    stages = degrees.get("pp") if "pp" in degrees else None
    steps = {_plan(degrees, world, rank).apply_steps(stage, stages) for rank in range(world)}
    assert len(steps) == 1, steps


@pytest.mark.parametrize("stage", [2, 3])
def test_sharding_without_a_process_group_is_the_data_parallel_engine(stage):
    # one process: nothing to shard across (distributed_model warns and wraps in the engine)
    assert _plan({"dp": 1}, 1).apply_steps(stage, distributed=False) == ("strategies", "data")
    assert _plan({"sharding": 2}, 2).wrapper(stage, distributed=False) == "data"


#: Paddle's optimizer side (fleet/meta_optimizers/dygraph_optimizer): DygraphShardingOptimizer (stage 1) and
#: stage 2's reduce to owners partition the optimizer state over hcg.get_sharding_parallel_group(); FSDP2 holds it
#: for stages 2/3 alone and stage 3 beside mp; sharding over every rank is the world's ZeRO-1
@pytest.mark.parametrize("degrees, stage, world, axis, ranks", [
    ({"dp": 2, "sharding": 2}, 1, 4, "sharding", [0, 1]),
    ({"sharding": 4}, 1, 4, None, None),
    ({"sharding": 4}, 2, 4, None, None),
    ({"sharding": 2, "mp": 2}, 1, 4, "sharding", [1, 3]),
    ({"sharding": 2, "mp": 2}, 2, 4, "sharding", [1, 3]),
    ({"sharding": 2, "pp": 2}, 2, 4, "sharding", [0, 1]),
    ({"sharding": 2, "mp": 2}, 3, 4, None, None),
    ({"sharding": 2, "dp": 2}, 2, 4, None, None),
    ({"dp": 2, "mp": 2}, 0, 4, None, None),
], ids=["dp2_sh2_s1", "sh4_s1", "sh4_s2", "mp2_sh2_s1", "mp2_sh2_s2", "pp2_sh2_s2", "mp2_sh2_s3", "dp2_sh2_s2",
        "mp2_dp2"])
def test_the_optimizer_state_group_comes_from_the_plan(degrees, stage, world, axis, ranks):
    plan = _plan(degrees, world, rank=1)
    assert plan.optimizer_state_axis(stage) == axis
    # init builds the mesh exactly when a wrapper or the optimizer needs a group other than the world
    split = any(degrees.get(a, 1) > 1 for a in ("mp", "pp", "sep"))
    assert plan.needs_groups(stage) == (split or axis is not None)
    if axis is not None:  # rank 1's sharding group in Paddle's layout (arange(world) over dp, pp, sharding, sep, mp)
        assert plan.ranks(axis) == ranks


def test_a_pipeline_layer_must_match_the_pipeline_degree():
    """The messages ``fleet.distributed_model`` gave before the plan checked them (tests pin them), raised before
    anything is applied."""
    with pytest.raises(ValueError, match=r"^the PipelineLayer has 1 stages but hybrid_configs\['pp_degree'\] is 2; "
                                         r"build it with num_stages=2 or topology=hcg.topology\(\)$"):
        _plan({"pp": 2}, 2).apply_steps(0, stages=1)
    with pytest.raises(ValueError, match=r"^the PipelineLayer has 4 stages but hybrid_configs\['pp_degree'\] is 2"):
        _plan({"pp": 2, "dp": 2}, 4).apply_steps(0, stages=4)
    with pytest.raises(ValueError, match=r"^fleet.distributed_model got a PipelineLayer but hybrid_configs"
                                         r"\['pp_degree'\] is 1 \(data parallel\); set strategy.hybrid_configs = "
                                         r"\{'pp_degree': 2, ...\}$"):
        _plan({"dp": 2}, 2).apply_steps(0, stages=2)
    with pytest.raises(TypeError, match=r"pp_degree'\] is 2 but fleet.distributed_model got a module that is not a "
                                        r"PipelineLayer; describe the model as PipelineLayer"):
        _plan({"pp": 2}, 2).apply_steps(0, stages=None)
    # one stage at pp_degree 1 is any module, as in Paddle
    assert _plan({"dp": 2}, 2).apply_steps(0, stages=1) == ("strategies", "data")


def test_an_unknown_sharding_stage_is_refused():
    with pytest.raises(ValueError, match="sharding stage 4 is not one of"):
        _plan({"dp": 2}, 2).wrapper(4)


def _plain_module_under_pp2(rank, world):
    import torch.nn as nn

    import fleetlite.distributed.fleet as fleet
    from fleetlite.distributed.fleet import fleet as fleet_impl

    fleet_impl._reset()
    strategy = fleet.DistributedStrategy(amp=True)
    strategy.amp_configs = {"dtype": "bfloat16"}
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}
    fleet.init(is_collective=True, strategy=strategy)
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="got a module that is not a PipelineLayer"):
        fleet.distributed_model(model)
    return "forward" in vars(model)  # did amp wrap its forward before the refusal?


def test_a_plain_module_under_pp_is_refused_before_any_strategy_applies():
    """The plan's check runs first (Note [apply order]): the model comes back untouched, on every rank."""
    from fleetlite.testing import run_ranks

    assert run_ranks(_plain_module_under_pp2, world_size=2, timeout=120) == [False, False]


@pytest.mark.parametrize("which", ["localsgd", "dgc", "lamb"])
def test_a_meta_optimizer_beside_hybrid_configs_sharding_is_refused(which):
    """hybrid_configs' sharding_degree turns sharding on as strategy.sharding does (Paddle's rule; the optimizer is
    then ZeRO over the sharding axis, and what steps is not the meta-optimizer): refused alike, not a warning."""
    import torch

    from fleetlite.distributed.fleet import DistributedStrategy
    from fleetlite.distributed.fleet.meta_optimizers import MetaOptimizers

    s = DistributedStrategy(**{which: True})
    s.hybrid_configs = {"sharding_degree": 2, "mp_degree": 2}
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(NotImplementedError, match=f"strategy.{which} with strategy.sharding \\(or hybrid_configs"):
        MetaOptimizers(opt, s)
