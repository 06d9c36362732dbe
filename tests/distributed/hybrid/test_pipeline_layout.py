"""A PipelineLayer's stage layout (its stage, the number of stages, every pipeline's ranks by stage) is the parallel
plan's, checked for every rank of several (world, pp, dp, mp, order) layouts against Paddle's
``CommunicateTopology`` formula (rank = the row-major index of its coordinate: a numpy reshape). No process group."""

import numpy as np
import pytest
import torch.distributed as td

from fleetlite.distributed.fleet.base.topology import CommunicateTopology
from fleetlite.distributed.fleet.meta_parallel.pipeline import layers
from fleetlite.distributed.fleet.meta_parallel.pipeline.layers import StageLayout
from fleetlite.distributed.fleet.plan import ParallelPlan

PADDLE = {"dp": "data", "pp": "pipe", "sharding": "sharding", "sep": "sep", "mp": "model"}

LAYOUTS = [  # degrees by axis, the mesh order (outermost first)
    ({"dp": 1, "pp": 2, "mp": 1}, ["dp", "pp", "mp"]),
    ({"dp": 2, "pp": 2, "mp": 1}, ["dp", "pp", "mp"]),
    ({"dp": 1, "pp": 2, "mp": 2}, ["dp", "pp", "mp"]),
    ({"dp": 2, "pp": 2, "mp": 2}, ["dp", "pp", "sharding", "sep", "mp"]),
    ({"dp": 2, "pp": 4, "mp": 1}, ["pp", "dp", "mp"]),
    ({"dp": 2, "pp": 2, "mp": 2}, ["mp", "pp", "dp"]),
    ({"dp": 1, "pp": 3, "mp": 2}, ["dp", "mp", "pp"]),
]


def _reference(degrees, order, rank):
    """Paddle's layout by a numpy reshape: the stage is the rank's index on the pipe axis; each pipeline is one
    row of the grid with the pipe axis moved last (Paddle's get_comm_list: the other axes in row-major order)."""
    dims = [degrees.get(a, 1) for a in order]
    grid = np.arange(int(np.prod(dims))).reshape(dims)
    axis = order.index("pp")
    stage = int(np.argwhere(grid == rank)[0][axis])
    pipelines = np.moveaxis(grid, axis, -1).reshape(-1, dims[axis]).tolist()
    return stage, dims[axis], pipelines


def _fake_world(monkeypatch, rank, world):
    monkeypatch.setattr(td, "is_initialized", lambda: True)
    monkeypatch.setattr(td, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(td, "get_world_size", lambda group=None: world)


@pytest.mark.parametrize("degrees, order", LAYOUTS)
def test_every_ranks_stage_layout_from_the_plan_matches_paddles_topology(degrees, order):
    world = int(np.prod(list(degrees.values())))
    for rank in range(world):
        plan = ParallelPlan(degrees, order, world, rank=rank)
        layout = StageLayout.of_plan(plan)
        assert (layout.stage_id, layout.num_stages, layout.pipelines) == _reference(degrees, order, rank)
        topo = CommunicateTopology([PADDLE[a] for a in order], [degrees.get(a, 1) for a in order])
        assert layout.pipelines == topo.get_comm_list("pipe")
        assert layout.stage_id == topo.get_coord(rank).pipe


@pytest.mark.parametrize("degrees, order", LAYOUTS)
def test_a_pipeline_layers_topology_gives_the_same_layout(monkeypatch, degrees, order):
    world = int(np.prod(list(degrees.values())))
    topo = CommunicateTopology([PADDLE[a] for a in order], [degrees.get(a, 1) for a in order])
    for rank in range(world):
        _fake_world(monkeypatch, rank, world)
        layout = StageLayout.resolve(None, topo)
        assert (layout.stage_id, layout.num_stages, layout.pipelines) == _reference(degrees, order, rank)
        assert StageLayout.resolve(degrees["pp"], topo) == layout


@pytest.mark.parametrize("world, pp", [(1, 1), (2, 2), (4, 2), (4, 4), (6, 3), (8, 2)])
def test_num_stages_alone_is_paddles_default_topology(monkeypatch, world, pp):
    # Paddle's PipelineLayer without a topology: CommunicateTopology(["data", "pipe", "model"], [world // pp, pp, 1])
    for rank in range(world):
        _fake_world(monkeypatch, rank, world)
        layout = StageLayout.resolve(pp, None)
        assert (layout.stage_id, layout.num_stages, layout.pipelines) == _reference(
            {"dp": world // pp, "pp": pp}, ["dp", "pp", "mp"], rank)
        assert layout.stage_id == rank % pp  # Note [pipeline rank layout]


def test_pipeline_layer_argument_errors_are_kept(monkeypatch):
    _fake_world(monkeypatch, 0, 4)
    with pytest.raises(ValueError, match=r"^num_stages=3 does not divide the world size 4; use a number of stages"):
        StageLayout.resolve(3, None)
    with pytest.raises(ValueError, match=r"^PipelineLayer needs num_stages or topology \(e.g\. topology=hcg"):
        StageLayout.resolve(None, None)
    topo = CommunicateTopology(["data", "pipe", "model"], [2, 2, 1])
    with pytest.raises(ValueError, match=r"^num_stages=4 but the topology has 2 pipeline stages; pass one or make"):
        StageLayout.resolve(4, topo)


def test_the_plans_comm_list_matches_paddles_for_every_axis():
    degrees, order = {"dp": 2, "pp": 2, "sharding": 1, "sep": 2, "mp": 2}, ["dp", "pp", "sharding", "sep", "mp"]
    plan = ParallelPlan(degrees, order, 16, rank=0)
    topo = CommunicateTopology([PADDLE[a] for a in order], [degrees[a] for a in order])
    for axis in order:
        assert plan.comm_list(axis) == topo.get_comm_list(PADDLE[axis])


def test_one_stage_pipeline_layer_with_a_shared_layer_needs_no_process_group():
    from torch import nn

    assert not td.is_initialized()
    model = layers.PipelineLayer([layers.SharedLayerDesc("e", nn.Linear, None, "weight", 4, 4), nn.ReLU(),
                                  layers.SharedLayerDesc("e", nn.Linear, None, "weight", 4, 4)], num_stages=1)
    assert model.shared_comm == {} and model.get_num_stages() == 1 and model.get_stage_id() == 0
