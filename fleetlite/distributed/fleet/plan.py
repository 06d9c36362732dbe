"""The parallel plan: the hybrid degrees, their checks, one named ``DeviceMesh`` and the groups cut from it.

``fleet.init`` makes one :class:`ParallelPlan` from the strategy and the world size (torchtitan's
``ParallelDims`` with Paddle's axis names); everything that needs a degree, a group or the mesh asks it
(``fleet.get_parallel_plan()``). ``HybridCommunicateGroup`` and ``CommunicateTopology`` are Paddle's views
of it (base/topology.py). Nothing else computes a degree or builds the hybrid mesh.

# Note [plan groups]
The mesh has one dimension per axis, named ``dp``, ``pp``, ``sharding``, ``sep`` and ``mp``, laid out in
``hybrid_configs['order']`` (Note [topology order]). Besides each axis the plan names the groups the rest
of the code asks for by purpose:

- ``data``: dp x sharding, the ranks that hold the same parameters and read different data (gradients
  are averaged over it; the samplers split over it);
- ``loss``: dp x sharding x sep, the ranks a loss is averaged over (sep splits one sample's sequence);
- ``model`` (alias ``replica``): mp x pp x sep, the ranks that together hold one copy of the model;
- ``check``: every axis but dp (Paddle's check/clip group: all ranks of one data-parallel replica);
- ``sharding_check``: every axis but sharding (Paddle's sharding check group);
- ``dp_sep`` and ``pp_mp``: Paddle's ``get_dp_sep_parallel_group`` / ``get_pp_mp_parallel_group``.

A fused group is the one axis's group when only one of its axes has a degree above 1, the world's
default group when it spans the world, else one flattened dimension of the mesh
(``mesh[axes]._flatten(name)``, as torchtitan flattens ``dp_shard_cp``). All of them are created by
:meth:`ParallelPlan.build`, in this fixed order on every rank (collective); nothing is created later.

Example::

    from fleetlite.distributed.fleet.plan import ParallelPlan
    plan = ParallelPlan.from_configs({"dp_degree": -1, "mp_degree": 2, "pp_degree": 1, "sharding_degree": 1,
                                      "sep_degree": 1, "order": ["dp", "pp", "sharding", "sep", "mp"]}, 4)
    plan.dp, plan.mp, plan.mp_enabled        # 2, 2, True
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from typing import Any

import torch
import torch.distributed as tdist

__all__ = ["ParallelPlan", "AXES", "GROUPS", "MODEL_WRAPPERS", "DATA_WRAPPERS", "ENGINE_WRAPPERS", "check_degrees",
           "resolve_degrees"]

#: the hybrid axes, Paddle's default order (outermost first)
AXES = ("dp", "pp", "sharding", "sep", "mp")
#: the fused groups by purpose: their axes (Note [plan groups])
GROUPS: dict[str, tuple[str, ...]] = {
    "data": ("dp", "sharding"),
    "loss": ("dp", "sharding", "sep"),
    "model": ("pp", "sep", "mp"),
    "replica": ("pp", "sep", "mp"),
    "check": ("pp", "sharding", "sep", "mp"),
    "sharding_check": ("dp", "pp", "sep", "mp"),
    "dp_sep": ("dp", "sep"),  # Paddle's get_dp_sep_parallel_group: segment parallelism averages over it
    "pp_mp": ("pp", "mp"),  # Paddle's get_pp_mp_parallel_group
}


# Note [apply order]
# ``fleet.distributed_model`` applies a strategy to a model in one fixed order, decided once by the plan
# (:meth:`ParallelPlan.apply_steps`) from its degrees and the strategy's sharding stage, in torchtitan's shape
# (``parallelize.py``: the pipeline split first, then tensor parallel, context parallel, activation
# checkpointing and compile, then FSDP or DDP, each step on its own mesh dimension) with Paddle's order
# (``fleet/model.py`` ``distributed_model``, by ``HybridCommunicateGroup.get_parallel_mode``: pp, then mp, then
# sep, then sharding, then dp):
# 1. the model is checked against the plan: a ``PipelineLayer`` has as many stages as ``pp_degree`` (one stage at
#    ``pp_degree`` 1 is any module, as in Paddle), and ``pp_degree > 1`` needs a ``PipelineLayer``;
# 2. the model-side strategies (sync batch norm, recompute, amp): ``"strategies"`` on the whole model, or
#    ``"stage_strategies"`` on this rank's pipeline stage (Note [pipeline strategies] in fleet.py);
# 3. one wrapper, the first of :data:`MODEL_WRAPPERS` whose axis is above 1 (``"pipeline"``, ``"tensor"``,
#    ``"segment"``: each runs the data/sharding axes inside itself), with sharding stage 3 beside tensor
#    parallelism ``"tensor_stage3"`` (FSDP2 over dp x sharding: Note [stage 3 beside mp]); with none of them
#    the data/sharding wrapper of :data:`DATA_WRAPPERS` (``"sharded"``: FSDP2 for stages 2 and 3; ``"data"``:
#    the data-parallel engine, whose optimizer shards stage 1).
# The optimizer side asks the same plan which group holds the optimizer state (:meth:`optimizer_state_axis`).

#: Paddle's order of the model-parallel wrappers: the first axis above 1 names the model's wrapper
MODEL_WRAPPERS: tuple[tuple[str, str], ...] = (("pp", "pipeline"), ("mp", "tensor"), ("sep", "segment"))
#: with no model-parallel axis above 1, the wrapper by sharding stage (0: no sharding; stage 1 shards the optimizer)
DATA_WRAPPERS: dict[int, str] = {0: "data", 1: "data", 2: "sharded", 3: "sharded"}
#: sharding stage 3 beside a model-parallel wrapper (the pipeline shards its stage itself: Note [stage 3 beside pp])
_STAGE3_BESIDE = {"tensor": "tensor_stage3"}
#: the model-side strategies' step before each wrapper (a pipeline's apply to this rank's stage)
_STRATEGIES_BEFORE = {"pipeline": "stage_strategies"}
#: the wrappers whose gradients fleetlite's data-parallel engine reduces (buckets, comm hooks, ``no_sync``)
ENGINE_WRAPPERS = frozenset({"data", "tensor", "segment"})
#: the wrappers beside which sharding stage 2 partitions the optimizer state over the sharding axis and reduces each
#: gradient to its owner (Note [hybrid sharding stage 2]); alone, stage 2 is FSDP2's
_OWNER_REDUCE_WRAPPERS = frozenset({"tensor", "pipeline"})


def resolve_degrees(hybrid_configs: Mapping[str, Any], world_size: int) -> dict[str, int]:
    """The degree of each axis from ``hybrid_configs``, ``dp_degree=-1`` resolved (Paddle's rule: dp is
    ``world / (pp * sharding * sep * mp)``).

    Example::

        resolve_degrees({"dp_degree": -1, "mp_degree": 2, "pp_degree": 1, "sharding_degree": 1,
                         "sep_degree": 1}, 4)["dp"]   # 2
    """
    h = hybrid_configs
    out = {"pp": h["pp_degree"], "sharding": h["sharding_degree"], "sep": h["sep_degree"], "mp": h["mp_degree"]}
    rest = out["pp"] * out["sharding"] * out["sep"] * out["mp"]
    out["dp"] = h["dp_degree"] if h["dp_degree"] != -1 else max(world_size // rest, 1)
    return out


def check_degrees(hybrid_configs: Mapping[str, Any], world_size: int) -> None:
    """ValueError, in one line, when ``hybrid_configs``' degrees do not fit ``world_size`` ranks."""
    hybrid = hybrid_configs
    dp, hsd = hybrid["dp_degree"], hybrid["sharding_degree"]
    model = hybrid["mp_degree"] * hybrid["pp_degree"] * hybrid["sep_degree"]
    others = model * max(hsd, 1)
    if world_size % others:
        raise ValueError(
            f"hybrid_configs degrees mp {hybrid['mp_degree']} x pp {hybrid['pp_degree']} x sharding {hsd} x sep "
            f"{hybrid['sep_degree']} = {others} do not divide the {world_size} ranks: make their product (times "
            "dp_degree) the world size")
    expected_dp = world_size // others
    if dp != -1 and dp != expected_dp:
        raise ValueError(
            f"hybrid_configs['dp_degree'] = {dp} does not fit {world_size} ranks (mp {hybrid['mp_degree']}, pp "
            f"{hybrid['pp_degree']}, sharding {hsd}, sep {hybrid['sep_degree']}): it must be {expected_dp} or -1 "
            "(the rest)")


def _order(degrees: Mapping[str, int], order: list[str]) -> list[str]:
    """``order`` with the axes it leaves out put outermost; an axis left out must have degree 1."""
    missing = [a for a in degrees if a not in order]
    for axis in missing:
        if degrees[axis] > 1:
            raise ValueError(f"hybrid_configs['order'] = {order} leaves out {axis!r} whose degree is {degrees[axis]}; "
                             "list every axis with a degree above 1")
    return missing + list(order)  # axes of degree 1 left out of the order: outermost (they change no rank's place)


class ParallelPlan:
    """The degrees of the hybrid axes, their layout, and (after :meth:`build`) one named ``DeviceMesh`` and
    the groups cut from it (Note [plan groups]).

    Made once by ``fleet.init`` (:meth:`from_strategy`); read it with ``fleet.get_parallel_plan()``. Pure
    arithmetic until :meth:`build`, which is collective (every rank, same order); ``fleet.init`` builds it
    for hybrid strategies, ``fleet.get_hybrid_communicate_group()`` on its first call otherwise.

    Args:
        degrees: ``{"dp", "pp", "sharding", "sep", "mp"}`` (any left out is 1).
        order: the axes of the mesh, outermost first (an axis left out has no group: a topology built by hand).
        world_size: the number of ranks; the degrees must multiply to it.
        rank: this rank (the process group's, else 0).

    Example::

        plan = fleet.get_parallel_plan()
        plan.dp, plan.mp, plan.pp_enabled
        torch.distributed.all_reduce(loss, group=plan.group("loss"))
        plan.submesh("mp")               # the tensor-parallel dimension of the one mesh
    """

    def __init__(self, degrees: Mapping[str, int], order: list[str] | tuple[str, ...], world_size: int,
                 rank: int | None = None, device_type: str | None = None) -> None:
        unknown = sorted(set(degrees) - set(AXES)) + [a for a in order if a not in AXES]
        if unknown or len(set(order)) != len(order):
            raise ValueError(f"a parallel plan takes the axes {list(AXES)} (each once), got {list(order)}")
        self.degrees = {a: int(degrees.get(a, 1)) for a in AXES}
        self.order = tuple(order)
        if any(d < 1 for d in self.degrees.values()):
            raise ValueError(f"parallel degrees must be positive integers, got {self.degrees}")
        absent = [a for a in AXES if a not in self.order and self.degrees[a] > 1]
        if absent:
            raise ValueError(f"the mesh order {list(self.order)} leaves out {absent} of degree above 1")
        self.world_size = int(world_size)
        if prod(self.degrees.values()) != self.world_size:
            raise ValueError(
                f"hybrid degrees {self._shown()} make {prod(self.degrees.values())} ranks but the world has "
                f"{self.world_size}: make their product the world size")
        initialized = tdist.is_available() and tdist.is_initialized()
        self.rank = rank if rank is not None else (tdist.get_rank() if initialized else 0)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside a plan of {self.world_size} ranks")
        self.device_type = device_type
        grid = torch.arange(self.world_size).reshape(*[self.degrees[a] for a in self.order]) if self.order else \
            torch.zeros((), dtype=torch.long)
        self._grid = grid
        where = (grid == self.rank).nonzero()[0].tolist() if self.order else []
        #: this rank's index on each axis (0 on an axis left out)
        self.coord = {a: 0 for a in AXES} | dict(zip(self.order, where))
        self.built = False
        self.mesh: Any = None
        self._groups: dict[str, Any] = {}
        self._meshes: dict[tuple[str, ...], Any] = {}  # submeshes by axes
        self._flat: dict[tuple[str, ...], Any] = {}  # flattened dimensions by the axes they fuse
        self._view: Any = None  # the HybridCommunicateGroup over this plan (base/topology.py sets it)

    # -- construction -------------------------------------------------------------------------------
    @classmethod
    def from_configs(cls, hybrid_configs: Mapping[str, Any], world_size: int, rank: int | None = None,
                     device_type: str | None = None) -> ParallelPlan:
        """The plan of ``hybrid_configs`` (degrees checked, ``dp_degree=-1`` resolved, its ``order``)."""
        check_degrees(hybrid_configs, world_size)
        degrees = resolve_degrees(hybrid_configs, world_size)
        order = _order(degrees, list(hybrid_configs.get("order", AXES)))
        return cls(degrees, order, world_size, rank=rank, device_type=device_type)

    @classmethod
    def from_strategy(cls, strategy: Any, world_size: int, device_type: str | None = None) -> ParallelPlan:
        """The plan of a ``DistributedStrategy``'s ``hybrid_configs`` on ``world_size`` ranks."""
        return cls.from_configs(strategy.hybrid_configs, world_size, device_type=device_type)

    def same_layout(self, other: ParallelPlan | None) -> bool:
        """Whether ``other`` has the same degrees, order and world (so its groups can serve this plan)."""
        return other is not None and (other.degrees, other.order, other.world_size) == (
            self.degrees, self.order, self.world_size)

    # -- the degrees --------------------------------------------------------------------------------
    dp = property(lambda self: self.degrees["dp"], doc="data-parallel degree")
    pp = property(lambda self: self.degrees["pp"], doc="pipeline-parallel degree")
    sharding = property(lambda self: self.degrees["sharding"], doc="sharding degree (hybrid_configs')")
    sep = property(lambda self: self.degrees["sep"], doc="segment (sequence) parallel degree")
    mp = property(lambda self: self.degrees["mp"], doc="tensor (model) parallel degree")
    dp_enabled = property(lambda self: self.dp > 1)
    pp_enabled = property(lambda self: self.pp > 1)
    sharding_enabled = property(lambda self: self.sharding > 1)
    sep_enabled = property(lambda self: self.sep > 1)
    mp_enabled = property(lambda self: self.mp > 1)

    @property
    def hybrid(self) -> bool:
        """True when a model is split across ranks (mp, pp or sep above 1): data then splits over ``data`` only."""
        return self.mp_enabled or self.pp_enabled or self.sep_enabled

    @property
    def data_rank(self) -> int:
        """Which part of the data this rank reads: ``dp_rank * sharding + sharding_rank`` (of :attr:`data_size`)."""
        return self.coord["dp"] * self.sharding + self.coord["sharding"]

    @property
    def data_size(self) -> int:
        """dp x sharding: the ranks that read different data."""
        return self.dp * self.sharding

    @property
    def checkpoint_degrees(self) -> dict[str, int]:
        """``{"dp", "mp", "pp"}`` as a checkpoint records them: sharding and sep folded into dp (every rank of
        world / (mp * pp) holds the same parameters)."""
        return {"dp": self.dp * self.sharding * self.sep, "mp": self.mp, "pp": self.pp}

    # -- what distributed_model and distributed_optimizer apply (Note [apply order]; no process group) --------
    def wrapper(self, sharding_stage: int = 0, distributed: bool = True) -> str:
        """The one wrapper ``fleet.distributed_model`` gives a model under this plan (Note [apply order]):
        ``"pipeline"``, ``"tensor"``, ``"tensor_stage3"``, ``"segment"``, ``"sharded"`` or ``"data"``.
        ``distributed``: whether a process group exists (without one, sharding has nothing to shard across).

        Example::

            ParallelPlan({"dp": 2, "mp": 2}, AXES, 4, rank=0).wrapper(sharding_stage=3)   # "tensor_stage3"
        """
        if sharding_stage not in DATA_WRAPPERS:
            raise ValueError(f"sharding stage {sharding_stage} is not one of {sorted(DATA_WRAPPERS)}")
        kind = next((k for axis, k in MODEL_WRAPPERS if self.degrees[axis] > 1), None)
        if kind is None:
            return DATA_WRAPPERS[sharding_stage] if distributed else "data"
        return _STAGE3_BESIDE.get(kind, kind) if sharding_stage == 3 else kind

    def apply_steps(self, sharding_stage: int = 0, stages: int | None = None,
                    distributed: bool = True) -> tuple[str, str]:
        """``fleet.distributed_model``'s steps for a model, in order (Note [apply order]): the model-side
        strategies' step (``"strategies"`` or, for a pipeline, ``"stage_strategies"``), then the wrapper
        (:meth:`wrapper`). ``stages``: the model's pipeline stages when it is a ``PipelineLayer``, else None.
        Raises, before anything is applied, when the model does not fit the plan.

        Example::

            plan = ParallelPlan({"pp": 2}, AXES, 2, rank=0)
            plan.apply_steps(stages=2)      # ("stage_strategies", "pipeline")
        """
        self.check_stages(stages)
        kind = self.wrapper(sharding_stage, distributed)
        return _STRATEGIES_BEFORE.get(kind, "strategies"), kind

    def check_stages(self, stages: int | None) -> None:
        """Raise, in one line, when a model with ``stages`` pipeline stages (None: a module that is no
        ``PipelineLayer``, one stage) does not fit this plan's pp degree: a TypeError for a plain module under
        ``pp_degree > 1``, else a ValueError."""
        pp = self.pp
        if (1 if stages is None else stages) == pp:
            return
        if stages is None:
            raise TypeError(f"hybrid_configs['pp_degree'] is {pp} but fleet.distributed_model got a module that is not "
                            f"a PipelineLayer; describe the model as PipelineLayer([LayerDesc(...), ...], "
                            f"num_stages={pp})")
        if pp == 1:
            raise ValueError(f"fleet.distributed_model got a PipelineLayer but hybrid_configs['pp_degree'] is {pp} "
                             f"(data parallel); set strategy.hybrid_configs = {{'pp_degree': {stages}, ...}}")
        raise ValueError(f"the PipelineLayer has {stages} stages but hybrid_configs['pp_degree'] is {pp}; build it "
                         f"with num_stages={pp} or topology=hcg.topology()")

    def optimizer_state_axis(self, sharding_stage: int) -> str | None:
        """The axis whose ranks partition the optimizer state where the optimizer does it (a
        ``ZeroRedundancyOptimizer`` over that axis's group): ``"sharding"`` for stage 1 over a sharding axis narrower
        than the world, and for stage 2 beside tensor or pipeline parallelism (Note [hybrid sharding stage 2]);
        None where the optimizer over every rank does (plain stage 1), FSDP2 does (stages 2/3 alone, stage 3
        beside mp) or nothing is sharded.

        Example::

            ParallelPlan({"sharding": 2, "mp": 2}, AXES, 4, rank=0).optimizer_state_axis(2)   # "sharding"
        """
        by_optimizer = sharding_stage == 1 or (
            sharding_stage == 2 and self.wrapper(sharding_stage) in _OWNER_REDUCE_WRAPPERS)
        return "sharding" if by_optimizer and 1 < self.sharding < self.world_size else None

    def needs_groups(self, sharding_stage: int) -> bool:
        """Whether the model's wrapper or the optimizer will ask for a group other than the world: a model split
        over mp, pp or sep, or the optimizer state over a sharding axis (``fleet.init`` then builds the mesh, on
        every rank)."""
        return self.data_size < self.world_size or self.optimizer_state_axis(sharding_stage) is not None

    # -- rank arithmetic (no process group) ---------------------------------------------------------
    def ranks(self, name: str, rank: int | None = None) -> list[int]:
        """The ranks of ``rank``'s (this rank's) group ``name``: an axis or a group of :data:`GROUPS`, sorted."""
        axes = self._axes(name)
        where = self.coord if rank is None else dict(
            zip(self.order, (self._grid == rank).nonzero()[0].tolist()))
        index = tuple(slice(None) if a in axes else where.get(a, 0) for a in self.order)
        return sorted(self._grid[index].flatten().tolist()) if self.order else [0]

    def comm_list(self, name: str) -> list[list[int]]:
        """Every group of ``name`` (an axis or a group of :data:`GROUPS`), one per position on the other axes,
        each in mesh order: Paddle's ``CommunicateTopology.get_comm_list`` (``comm_list("pp")``: every pipeline's
        ranks by stage).

        Example::

            ParallelPlan({"dp": 2, "pp": 2}, ("dp", "pp"), 4, rank=0).comm_list("pp")   # [[0, 1], [2, 3]]
        """
        axes = self._axes(name)
        if not self.order:
            return [[0]]
        inner = [i for i, a in enumerate(self.order) if a in axes]
        outer = [i for i, a in enumerate(self.order) if a not in axes]
        size = prod(self._grid.shape[i] for i in inner)
        return self._grid.permute(*outer, *inner).reshape(-1, size).tolist()

    def group_or_default(self, name: str) -> Any:
        """The process group ``name`` for a collective's ``group=``: None (torch's default group) when it spans every
        rank, so that no mesh is built for it (a data-parallel plan's ``data`` group is the world); else
        :meth:`group` (collective on the first call)."""
        return None if len(self.ranks(name)) == self.world_size else self.group(name)

    def split_group(self, name: str) -> Any:
        """The process group over which a value split along ``name`` is summed (a tensor-parallel slice's norm
        over ``mp``): None when ``name`` has one rank (nothing is split; no mesh is built), else :meth:`group`."""
        return None if len(self.ranks(name)) == 1 else self.group(name)

    def _axes(self, name: str) -> tuple[str, ...]:
        if name in AXES:
            return (name,)
        if name not in GROUPS:
            raise ValueError(f"unknown group {name!r}; a plan has the axes {list(AXES)} and the groups "
                             f"{list(GROUPS)}")
        return GROUPS[name]

    # -- the mesh and its groups (collective) -------------------------------------------------------
    def build(self) -> ParallelPlan:
        """Create the mesh and every named group (collective: every rank, once; a no-op after the first call or
        without a process group)."""
        if self.built:
            return self
        self.built = True
        if not (tdist.is_available() and tdist.is_initialized()) or not self.order:
            return self
        from torch.distributed.device_mesh import DeviceMesh

        device_type = self.device_type or ("cuda" if torch.cuda.is_available() else "cpu")
        self.mesh = DeviceMesh(device_type, self._grid, mesh_dim_names=self.order)
        for axis in self.order:
            self._groups[axis] = self.mesh.get_group(axis)
        for name, axes in GROUPS.items():  # Note [plan groups]: a fixed order on every rank
            self._groups[name] = self._fused(name, axes)
        return self

    def _fused(self, name: str, axes: tuple[str, ...]) -> Any:
        present = [a for a in self.order if a in axes]
        if not present:
            return None
        big = [a for a in present if self.degrees[a] > 1]
        if len(big) <= 1:
            return self._groups[big[0] if big else present[0]]
        if prod(self.degrees[a] for a in big) == self.world_size:
            return tdist.group.WORLD
        key = tuple(big)
        if key not in self._flat:
            self._flat[key] = self.mesh[key]._flatten(name)
        return self._flat[key].get_group()

    def group(self, name: str) -> Any:
        """The process group ``name`` of this rank (Note [plan groups]); None single-process or for an axis
        the mesh leaves out. Builds the plan first (collective on that first call)."""
        self._axes(name)
        self.build()
        return self._groups.get(name)

    def submesh(self, *axes: str) -> Any:
        """The mesh of ``axes`` cut from the one mesh, in the mesh's order (the same object every call; no new
        process group): ``submesh("mp")`` for tensor parallelism, ``submesh("dp", "sharding")`` for FSDP2's
        replicate x shard. None single-process or when the mesh leaves out one of ``axes``."""
        unknown = [a for a in axes if a not in AXES]
        if unknown or not axes:
            raise ValueError(f"submesh takes axes of {list(AXES)}, got {list(axes)}")
        self.build()
        key = tuple(a for a in self.order if a in axes)
        if self.mesh is None or len(key) != len(set(axes)):
            return None
        if key not in self._meshes:
            self._meshes[key] = self.mesh[key[0] if len(key) == 1 else key]
        return self._meshes[key]

    def _shown(self) -> str:
        return ", ".join(f"{a}={self.degrees[a]}" for a in self.order or AXES)

    def __repr__(self) -> str:
        return f"ParallelPlan({self._shown()}, world_size={self.world_size}, built={self.built})"
