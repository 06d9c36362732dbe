"""Paddle's hybrid-parallel topology: ``CommunicateTopology`` (pure rank arithmetic) and
``HybridCommunicateGroup`` (the process groups of each parallel axis): Paddle's views of the
:class:`~fleetlite.distributed.fleet.plan.ParallelPlan`, whose one named
:class:`torch.distributed.device_mesh.DeviceMesh` and groups (Note [plan groups]) the HCG hands out.

# Note [topology order]
Ranks are laid out row-major over the axes in ``hybrid_configs['order']``
(Paddle's default ``["dp", "pp", "sharding", "sep", "mp"]``: model parallel
innermost, so the ranks of one tensor-parallel group are neighbours). The
coordinate of a rank is its index in ``arange(world).reshape(dims)``, which is
also how torch lays out a ``DeviceMesh``: the mesh dimension named ``"mp"``
holds exactly the groups of ``get_comm_list("model")``, so the HCG's groups
*are* the plan's mesh's groups (created once, in the same order on every rank).

# Note [sharding with mp and pp]
With ``sharding_degree`` > 1 (sharding stage 1) next to mp/pp, or next to dp alone, the sharding axis
splits the data as dp does: the ranks of one dp × sharding group hold the same parameters (the same mp
slices of the same pipeline stage) and read different data, so gradients are averaged over dp × sharding
(the data-parallel engine: over that group under mp, over all ranks without mp/pp;
``PipelineParallel._reduce_gradients`` under pp), and each rank of the sharding group keeps the optimizer
state of its part of the parameters (``ZeroRedundancyOptimizer`` over the sharding group; the updated
parameters are broadcast inside it after the step). Every sharding rank then holds full, equal gradients,
so one copy of the model is mp × pp × sep of one dp *and* sharding coordinate: the global norm adds the
slices over that group (``_get_replica_group``), not over Paddle's check group, which spans the sharding
axis too (Paddle's stage 1 keeps only the owner's gradients). Under stage 2 a rank keeps only the gradients it
owns, and the norm adds the owners' sums over the sharding group too (Note [hybrid sharding stage 2]).

Example::

    from fleetlite.distributed.fleet import CommunicateTopology
    topo = CommunicateTopology(["data", "pipe", "model"], [2, 2, 2])
    topo.get_rank(data=1, pipe=0, model=1)    # 5
    topo.get_comm_list("model")               # [[0, 1], [2, 3], [4, 5], [6, 7]]
"""

from __future__ import annotations

import collections
import logging
import os
from functools import reduce
from itertools import product
from typing import Any

import torch.distributed as tdist

from .. import context
from ..plan import ParallelPlan

__all__ = ["CommunicateTopology", "HybridCommunicateGroup", "ParallelMode", "PADDLE_TO_MESH", "AXIS_OF", "hcg_of",
           "get_hybrid_communicate_group"]

logger = logging.getLogger("fleetlite.fleet")

#: Paddle's axis names (topology) -> the DeviceMesh dimension names (and hybrid_configs' order keys)
PADDLE_TO_MESH = {"data": "dp", "pipe": "pp", "sharding": "sharding", "sep": "sep", "model": "mp"}
#: hybrid_configs' order keys -> Paddle's axis names
AXIS_OF = {v: k for k, v in PADDLE_TO_MESH.items()}

class ParallelMode:
    """Paddle's parallel modes (``hcg.get_parallel_mode()``)."""

    DATA_PARALLEL = 0
    TENSOR_PARALLEL = 1
    PIPELINE_PARALLEL = 2
    SHARDING_PARALLEL = 3
    SEGMENT_PARALLEL = 4


class CommunicateTopology:
    """The coordinates of every rank on the named parallel axes (Paddle's class, pure Python).

    Args:
        hybrid_group_names: axis names, outermost first (Paddle's: ``data``, ``pipe``, ``sharding``, ``sep``,
            ``model``).
        dims: the degree of each axis; their product is the world size.

    Example::

        topo = CommunicateTopology(["data", "model"], [2, 2])
        topo.get_coord(3)               # Coordinate(data=1, model=1)
        topo.get_axis_list("data", 0)   # [0, 1]
    """

    def __init__(self, hybrid_group_names: list[str] | None = None, dims: list[int] | None = None) -> None:
        names = list(hybrid_group_names) if hybrid_group_names is not None else [
            "data", "pipe", "sharding", "sep", "model"]
        dims = list(dims) if dims is not None else [1] * len(names)
        if len(names) != len(dims):
            raise ValueError(f"CommunicateTopology got {len(names)} axis names {names} but {len(dims)} dims {dims}; "
                             "give one degree per axis")
        if any(not isinstance(d, int) or d < 1 for d in dims):
            raise ValueError(f"CommunicateTopology dims must be positive integers, got {dims}")
        self._parallel_names = names
        self._dims = dims
        self.coordinate = collections.namedtuple("Coordinate", self._parallel_names)
        self._world_size = reduce(lambda x, y: x * y, self._dims, 1)
        all_coordinate = [self.coordinate(*x) for x in product(*[range(d) for d in self._dims])]
        self._coord2rank = dict(zip(all_coordinate, range(len(all_coordinate))))
        self._rank2coord = dict(zip(self._coord2rank.values(), self._coord2rank.keys()))

    def get_hybrid_group_names(self) -> list[str]:
        return self._parallel_names

    def get_dim(self, axis_name: str) -> int:
        """The degree of ``axis_name``."""
        return self._dims[self._axis(axis_name)]

    get_dim_size = get_dim

    def world_size(self) -> int:
        return self._world_size

    def _axis(self, axis_name: str) -> int:
        if axis_name not in self._parallel_names:
            raise ValueError(f"unknown parallel axis {axis_name!r}; this topology has {self._parallel_names}")
        return self._parallel_names.index(axis_name)

    def get_rank(self, **args: int) -> int:
        """The rank at a coordinate given by every axis, e.g. ``get_rank(data=0, pipe=1, model=0)``."""
        if len(args) != len(self._dims):
            raise ValueError(f"get_rank needs one coordinate per axis {self._parallel_names}, got {sorted(args)}")
        key = self.coordinate(**args)
        if key not in self._coord2rank:
            raise ValueError(f"coordinate {key} is outside the topology {dict(zip(self._parallel_names, self._dims))}")
        return self._coord2rank[key]

    def get_coord(self, rank: int) -> Any:
        """The ``Coordinate`` namedtuple of ``rank``."""
        if rank not in self._rank2coord:
            raise ValueError(f"rank {rank} is outside the topology of {self._world_size} ranks")
        return self._rank2coord[rank]

    def get_axis_list(self, axis_name: str, index: int) -> list[int]:
        """The ranks whose coordinate on ``axis_name`` is ``index``, sorted."""
        axis = self._axis(axis_name)
        return sorted(self._coord2rank[c] for c in self._coord2rank if c[axis] == index)

    def get_comm_list(self, axis_name: str) -> list[list[int]]:
        """The communication groups along ``axis_name``: one list per position on the other axes."""
        self._axis(axis_name)
        others = [n for n in self._parallel_names if n != axis_name]
        result = []
        for x in product(*[range(self.get_dim(n)) for n in others]):
            key = dict(zip(others, x))
            group = []
            for i in range(self.get_dim(axis_name)):
                key[axis_name] = i
                group.append(self._coord2rank[self.coordinate(**key)])
            result.append(group)
        return result

    def get_fused_ranks(self, fused_axis: list[str]) -> list[list[int]]:
        """The groups spanning all the axes in ``fused_axis`` together (one per position on the others)."""
        non_fused = [n for n in self._parallel_names if n not in fused_axis]
        groups: dict[tuple[int, ...], list[int]] = {}
        for coord, rank in self._coord2rank.items():
            groups.setdefault(tuple(getattr(coord, n) for n in non_fused), []).append(rank)
        return [sorted(g) for _, g in sorted(groups.items())]

    def get_rank_from_stage(self, global_rank: int, **kwargs: int) -> int:
        """The rank whose coordinate is ``global_rank``'s with the given axes replaced (e.g. ``pipe=1``)."""
        coord = self.get_coord(global_rank)
        return self.get_rank(**coord._replace(**kwargs)._asdict())

    def __repr__(self) -> str:
        return f"CommunicateTopology({self._parallel_names}, {self._dims})"


class HybridCommunicateGroup:
    """The process groups of each parallel axis for this rank (Paddle's class and method names).

    Build it through ``fleet.init(is_collective=True, strategy=s)`` with ``s.hybrid_configs``, then
    ``fleet.get_hybrid_communicate_group()``. The groups are torch process groups (Paddle's ``group.ranks`` is
    ``torch.distributed.get_process_group_ranks(group)``; None single-process), all read from ``plan``, the
    :class:`~fleetlite.distributed.fleet.plan.ParallelPlan` it views; ``mesh`` is the plan's named
    ``DeviceMesh`` (None single-process). ``is_first_stage`` / ``is_last_stage`` are attributes, as in Paddle.
    Built by hand from a topology (as Paddle's tests do) it makes a plan of its own, which becomes fleet's.

    Example::

        hcg = fleet.get_hybrid_communicate_group()
        hcg.get_model_parallel_rank(), hcg.get_model_parallel_world_size()
        torch.distributed.all_reduce(t, group=hcg.get_model_parallel_group())
    """

    def __init__(self, topology: CommunicateTopology, device_type: str | None = None) -> None:
        names = topology.get_hybrid_group_names()
        unknown = [n for n in names if n not in PADDLE_TO_MESH]
        if unknown or len(set(names)) != len(names):
            raise ValueError(f"HybridCommunicateGroup needs the axes {list(PADDLE_TO_MESH)} (each once), got {names}")
        initialized = tdist.is_available() and tdist.is_initialized()
        plan = ParallelPlan({PADDLE_TO_MESH[n]: topology.get_dim(n) for n in names},
                            [PADDLE_TO_MESH[n] for n in names], tdist.get_world_size() if initialized else 1,
                            device_type=device_type)
        self._attach(plan.build(), topology)  # collective: every rank builds the plan's groups
        context.state.plan = plan  # Paddle's last-built-HCG singleton is the plan fleet holds

    @classmethod
    def _of(cls, plan: ParallelPlan) -> HybridCommunicateGroup:
        """The view of a built ``plan`` (no new process group)."""
        hcg = cls.__new__(cls)
        hcg._attach(plan, CommunicateTopology([AXIS_OF[a] for a in plan.order], [plan.degrees[a] for a in plan.order]))
        return hcg

    def _attach(self, plan: ParallelPlan, topology: CommunicateTopology) -> None:
        """Read everything from ``plan`` (Note [plan groups]): degrees, coordinates, the mesh and its groups."""
        self.plan = plan
        plan._view = self
        self.nranks, self.global_rank, self._topo = plan.world_size, plan.rank, topology
        names = topology.get_hybrid_group_names()
        self._dp_degree, self._mp_degree, self._pp_degree = plan.dp, plan.mp, plan.pp
        self._sharding_degree, self._sep_degree = plan.sharding, plan.sep
        c = plan.coord
        self._data_parallel_id, self._model_parallel_id = c["dp"], c["mp"]
        self._sharding_parallel_id, self._sep_parallel_id, self.stage_id = c["sharding"], c["sep"], c["pp"]
        self.mesh = plan.mesh
        self._groups: dict[str, Any] = {n: plan.group(PADDLE_TO_MESH[n]) for n in names}
        self._lists: dict[str, list[int]] = {n: plan.ranks(PADDLE_TO_MESH[n]) for n in names}
        # the check/clip group (Paddle's _set_check_group("data")): every rank of one data-parallel replica;
        # the groups sharding adds (Note [sharding with mp and pp]): dp x sharding, the replica, the sharding check
        self._check_group = plan.group("check")
        self._data_sharding_group, self._replica_group = plan.group("data"), plan.group("replica")
        self._sharding_check_group = plan.group("sharding_check")
        self.is_first_stage = self.stage_id == 0
        self.is_last_stage = self.stage_id == self._pp_degree - 1
        self._p2p_groups: tuple[Any, Any, Any, Any] | None = None
        if self._pp_degree > 1:
            pipe = self._lists["pipe"]
            idx = pipe.index(self.global_rank)
            self.next_rank, self.prev_rank = pipe[(idx + 1) % len(pipe)], pipe[(idx - 1) % len(pipe)]
            # Paddle's switch for the four-direction p2p groups, read where Paddle reads it (topology.py)
            if plan.mesh is not None and os.environ.get("PADDLE_USE_FOUR_DIRECTIONS_P2P", "").lower() in ("1", "true"):
                self._p2p_groups = self._four_directions_p2p_groups()
        logger.debug("HybridParallelInfo: rank %d, %s", self.global_rank, plan)

    def _four_directions_p2p_groups(self) -> tuple[Any, Any, Any, Any]:
        """Paddle's ``_set_four_directions_p2p_group``: a 2-rank group per neighbouring pair and direction."""
        send_next = send_prev = recv_next = recv_prev = None
        for ranks in self._topo.get_comm_list("pipe"):
            for idx, curr in enumerate(ranks):
                nxt, prev = ranks[(idx + 1) % len(ranks)], ranks[(idx - 1) % len(ranks)]
                group = tdist.new_group(ranks=sorted({curr, nxt}))
                if self.global_rank == curr:
                    send_next = group
                elif self.global_rank == nxt:
                    recv_prev = group
                group = tdist.new_group(ranks=sorted({prev, curr}))
                if self.global_rank == curr:
                    send_prev = group
                elif self.global_rank == prev:
                    recv_next = group
        return send_next, send_prev, recv_next, recv_prev

    def create_fuse_group(self, fused_strategy_list: list[str]) -> tuple[list[int], Any]:
        """Paddle's ``create_fuse_group``: one process group per position on the other axes, spanning the axes
        in ``fused_strategy_list`` (Paddle's names, e.g. ``["data", "sep"]``); returns ``(ranks, group)`` of
        this rank's. Collective: every rank calls it with the same list (each call creates new groups).

        Example::

            ranks, group = hcg.create_fuse_group(["pipe", "model"])   # the mp × pp ranks of this replica
        """
        if not fused_strategy_list:
            raise ValueError("create_fuse_group needs at least one axis name (e.g. ['data', 'sep'])")
        for n in fused_strategy_list:
            self._topo._axis(n)  # an unknown name fails with the topology's axes
        mine: tuple[list[int], Any] | None = None
        for ranks in sorted(self._topo.get_fused_ranks(list(fused_strategy_list))):
            group = tdist.new_group(ranks=ranks) if tdist.is_initialized() else None
            if self.global_rank in ranks:
                mine = (ranks, group)
        assert mine is not None
        return mine

    def _group(self, axis: str) -> Any:
        return self._groups.get(axis)

    def get_parallel_mode(self) -> int:
        """Paddle's rule: pp > mp > sep > sharding > dp (a single rank counts as data parallel)."""
        if self._pp_degree > 1:
            return ParallelMode.PIPELINE_PARALLEL
        if self._mp_degree > 1:
            return ParallelMode.TENSOR_PARALLEL
        if self._sep_degree > 1:
            return ParallelMode.SEGMENT_PARALLEL
        if self._sharding_degree > 1:
            return ParallelMode.SHARDING_PARALLEL
        return ParallelMode.DATA_PARALLEL

    def topology(self) -> CommunicateTopology:
        return self._topo

    def get_global_rank(self) -> int:
        return self.global_rank

    # data parallel
    def get_data_parallel_rank(self) -> int:
        return self._data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self._dp_degree

    def get_data_parallel_group(self) -> Any:
        return self._group("data")

    def get_data_parallel_group_src_rank(self) -> int:
        return self._lists["data"][0]

    # model (tensor) parallel
    def get_model_parallel_rank(self) -> int:
        return self._model_parallel_id

    def get_model_parallel_world_size(self) -> int:
        return self._mp_degree

    def get_model_parallel_group(self) -> Any:
        return self._group("model")

    def get_model_parallel_group_src_rank(self) -> int:
        return self._lists["model"][0]

    # pipeline parallel
    def get_stage_id(self) -> int:
        return self.stage_id

    def get_pipe_parallel_rank(self) -> int:
        return self.stage_id

    def get_pipe_parallel_world_size(self) -> int:
        return self._pp_degree

    def get_pipe_parallel_group(self) -> Any:
        return self._group("pipe")

    def get_pipe_parallel_group_src_rank(self) -> int:
        return self._lists["pipe"][0]

    def get_rank_from_stage(self, stage_id: int, **kwargs: int) -> int:
        """The global rank of stage ``stage_id`` with this rank's other coordinates (or those given)."""
        return self._topo.get_rank_from_stage(self.global_rank, pipe=stage_id, **kwargs)

    def _get_p2p_next_rank(self) -> int:
        """The next stage's rank in this rank's pipeline (the first stage's after the last, as Paddle)."""
        self._check_pipe("_get_p2p_next_rank")
        return self.next_rank

    def _get_p2p_prev_rank(self) -> int:
        self._check_pipe("_get_p2p_prev_rank")
        return self.prev_rank

    def _check_pipe(self, what: str) -> None:
        if self._pp_degree == 1:
            raise RuntimeError(f"hcg.{what}() needs a pipeline, but pp_degree is 1 (no next/previous stage); set "
                               "hybrid_configs['pp_degree'] > 1")

    def get_p2p_groups(self) -> tuple[Any, Any, Any, Any]:
        """Paddle's four-direction p2p groups ``(send_next, send_prev, recv_next, recv_prev)``: 2-rank groups
        built at construction when ``PADDLE_USE_FOUR_DIRECTIONS_P2P=1`` is set and pp_degree > 1, as in Paddle.

        Example::

            send_next, send_prev, recv_next, recv_prev = hcg.get_p2p_groups()
        """
        if self._p2p_groups is None:
            raise RuntimeError("hcg.get_p2p_groups() needs the four-direction p2p groups, built only with "
                               "PADDLE_USE_FOUR_DIRECTIONS_P2P=1 in the environment and pp_degree > 1 (as in Paddle); "
                               "set it before fleet.init, or send over hcg.get_pipe_parallel_group()")
        return self._p2p_groups

    # sharding parallel
    def get_sharding_parallel_rank(self) -> int:
        return self._sharding_parallel_id

    def get_sharding_parallel_world_size(self) -> int:
        return self._sharding_degree

    def get_sharding_parallel_group(self) -> Any:
        return self._group("sharding")

    def get_sharding_parallel_group_src_rank(self) -> int:
        return self._lists["sharding"][0]

    # data × sharding: the ranks that split the data (Note [sharding with mp and pp]); fleetlite's names
    def get_data_sharding_parallel_rank(self) -> int:
        """Which part of the data this rank reads: ``dp_rank * sharding_degree + sharding_rank`` (PaddleNLP's
        ``dataset_rank``); the data-parallel rank without sharding.

        Example::

            part = hcg.get_data_sharding_parallel_rank()      # of hcg.get_data_sharding_parallel_world_size()
        """
        return self._data_parallel_id * self._sharding_degree + self._sharding_parallel_id

    def get_data_sharding_parallel_world_size(self) -> int:
        return self._dp_degree * self._sharding_degree

    def get_data_sharding_parallel_group(self) -> Any:
        """The dp × sharding ranks (same parameters, different data): gradients are averaged over it."""
        return self._data_sharding_group

    # Paddle's fused groups of sep: they exist only with sep_degree > 1, as in Paddle
    def get_dp_sep_parallel_group(self) -> Any:
        """The dp × sep ranks (the same parameters, different data or sequence parts): segment parallelism
        averages gradients over it (the plan's ``dp_sep`` group)."""
        return self._fused_sep_group("dp_sep", ["data", "sep"], "get_dp_sep_parallel_group")

    def get_pp_mp_parallel_group(self) -> Any:
        """The pp × mp ranks of this rank's dp and sep coordinates (the plan's ``pp_mp`` group)."""
        return self._fused_sep_group("pp_mp", ["pipe", "model"], "get_pp_mp_parallel_group")

    def _fused_sep_group(self, name: str, axes: list[str], what: str) -> Any:
        if self._sep_degree == 1:
            raise RuntimeError(f"hcg.{what}() exists only with sep_degree > 1 (as in Paddle); set "
                               f"hybrid_configs['sep_degree'] > 1, or call hcg.create_fuse_group({axes})[1] on "
                               "every rank")
        return self.plan.group(name)  # the plan's fused group (built with the others)

    def _check_valid_topo(self) -> bool:
        """Paddle's check: the degrees multiply to the world size."""
        return (self._dp_degree * self._mp_degree * self._pp_degree * self._sharding_degree * self._sep_degree
                == self.nranks)

    def _get_replica_group(self) -> Any:
        """mp × pp × sep of this rank's dp and sharding coordinates: the ranks holding one copy of the model."""
        return self._replica_group

    # sequence (segment) parallel
    def get_sep_parallel_rank(self) -> int:
        return self._sep_parallel_id

    def get_sep_parallel_world_size(self) -> int:
        return self._sep_degree

    def get_sep_parallel_group(self) -> Any:
        return self._group("sep")

    def get_sep_parallel_group_src_rank(self) -> int:
        return self._lists["sep"][0]

    # the group that sees every parameter once: global-norm clipping and the amp inf/nan check
    def get_check_parallel_group(self, sharding: bool = False) -> Any:
        """All ranks of this data-parallel replica (mp × pp × sharding × sep): Paddle's check/clip group;
        ``sharding=True``: the ranks with this rank's sharding coordinate (Paddle's sharding check group)."""
        return self._sharding_check_group if sharding else self._check_group

    def __repr__(self) -> str:
        return (f"HybridCommunicateGroup(rank={self.global_rank}, dp={self._dp_degree}, pp={self._pp_degree}, "
                f"sharding={self._sharding_degree}, sep={self._sep_degree}, mp={self._mp_degree})")


def hcg_of(plan: ParallelPlan) -> HybridCommunicateGroup:
    """Paddle's view of ``plan`` (built here if it is not yet: collective), the same object every call."""
    plan.build()
    return plan._view if plan._view is not None else HybridCommunicateGroup._of(plan)


def get_hybrid_communicate_group() -> HybridCommunicateGroup | None:
    """The HybridCommunicateGroup of the plan fleet holds (None before one is built: ``fleet.init`` builds it for
    hybrid strategies, ``fleet.get_hybrid_communicate_group()`` otherwise, or ``HybridCommunicateGroup(topo)``)."""
    plan = context.state.plan
    return plan._view if plan is not None else None


def __getattr__(name: str) -> Any:
    if name == "_HYBRID_PARALLEL_GROUP":  # Paddle's module-level singleton, read from fleet's one plan
        return get_hybrid_communicate_group()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
