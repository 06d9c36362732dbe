"""Sharding stage 3 (FSDP2) beside tensor parallelism: parameters, gradients and optimizer state sharded over the
ranks that hold the same tensor-parallel slices and read different data.

# Note [stage 3 beside mp]
torchtitan's 2-D composition (``apply_fsdp`` on the data mesh after tensor parallelism) on fleetlite's
tensor-parallel layers: the layers keep their local slices and Paddle's view of them (Note [tensor-parallel
parameters]), and FSDP2's ``fully_shard`` is applied to the model over a 1-D mesh of the data × sharding ranks
(:func:`data_mesh`: the ranks with the same mp rank, the same parameters, and other data). To FSDP2 each slice
is a whole tensor, which it shards along dim 0 over that mesh; the mp collectives stay in the layers' forward
and backward, which run on the unsharded slices FSDP2 all-gathers for them. FSDP2 reduce-scatters the
gradients averaged over data × sharding (the engine's all-reduce is not used for this model), so a rank holds
1/(dp × sharding) of its slices' parameters, gradients and optimizer state: mp2 × sharding2 on 4 ranks holds a
quarter of the model per rank, where mp2 × dp2 holds a half.

The sharded parameters are ``DTensor`` s on the data mesh; each keeps its slice's tags (``split_axis``,
``mp_group``), so the full state (Note [hybrid full state]) gathers a parameter over the data mesh and then
over mp, and the global norm is the one gradient rule's (``gradients.global_norm``): a gradient's shard is
added over its data mesh, a slice's sum over mp, so every element of the full model counts once. Before sharding, the
replicated parameters are broadcast over mp (as ``TensorParallel`` does) and every parameter and buffer over
data × sharding (as the data-parallel engine does), so the ranks start from the same model.

Example::

    strategy.hybrid_configs = {"mp_degree": 2, "sharding_degree": 2}
    strategy.sharding, strategy.sharding_configs = True, {"stage": 3}
    fleet.init(is_collective=True, strategy=strategy)
    model = fleet.distributed_model(TPModel())       # a HybridStage3: FSDP2 over dp x sharding, slices over mp
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters()))
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ....parallel.comm import broadcast_coalesced
from ....parallel.sharded import ShardedDataParallel
from ..gradients import GradGroups, clip_by_global_norm
from . import hybrid_state
from .mp_layers import is_split
from .sharded_state import MESH_2D_ATTR

__all__ = ["HybridStage3", "data_mesh", "data_mp_mesh", "STAGE3_ATTR", "wants_stage3_pipeline", "shard_pipeline_stage"]

#: the attribute a stage-3 parameter beside mp carries: the data × sharding group it is sharded over
STAGE3_ATTR = "stage3_group"
_TAGS = ("split_axis", "mp_group", "is_firstly_shared")


def data_mesh(hcg: Any) -> Any:
    """The 1-D ``DeviceMesh`` of this rank's data × sharding ranks (same parameters, other data), from the hcg's
    named mesh: its ``"dp"`` or ``"sharding"`` dimension, or both flattened when both have several ranks.

    Example::

        mesh = data_mesh(fleet.get_hybrid_communicate_group())     # mp2 x sharding2 on 4 ranks: 2 ranks
    """
    mesh = hcg.mesh
    names = mesh.mesh_dim_names
    dims = [n for n in ("dp", "sharding") if n in names and mesh.size(names.index(n)) > 1]
    if not dims:
        dims = ["sharding" if "sharding" in names else "dp"]
    if len(dims) == 1:
        return mesh[dims[0]]
    with warnings.catch_warnings():  # torch's notice that slicing a flattened dimension will change: still ours
        warnings.filterwarnings("ignore", message="Slicing a flattened dim", category=UserWarning)
        try:
            return mesh["data"]  # the parallel plan's flattened dp x sharding ("data" group), when it made one
        except (KeyError, RuntimeError, ValueError):
            return mesh[tuple(dims)]._flatten("dp_sharding")


def data_mp_mesh(hcg: Any) -> Any:
    """The 2-D ``DeviceMesh`` (data × sharding, mp) of this rank, from the hcg's named mesh (see :func:`data_mesh`)."""
    mesh, name = hcg.mesh, data_mesh(hcg).mesh_dim_names[0]  # (flattened first when dp and sharding both > 1)
    with warnings.catch_warnings():  # torch's notice that slicing a flattened dimension will change: still ours
        warnings.filterwarnings("ignore", message="Slicing a flattened dim", category=UserWarning)
        return mesh[(name, "mp")]


def _retag(layers: nn.Module, tags: Mapping[str, Mapping[str, Any]], group: Any, mesh_2d: Any) -> None:
    """Give FSDP2's new parameters of ``layers`` their slices' tags back (``tags``: by name, taken before
    ``fully_shard``), the data × sharding ``group`` they are sharded over, and every tensor the (data × sharding, mp)
    mesh: every tensor's checkpoint view composes its data and mp placements (Note [tensor-parallel parameters])."""
    for name, p in layers.named_parameters():
        for attr, value in {**tags.get(name, {}), STAGE3_ATTR: group, MESH_2D_ATTR: mesh_2d}.items():
            setattr(p, attr, value)


class HybridStage3(ShardedDataParallel):
    """A tensor-parallel model sharded by FSDP2 over the data × sharding ranks (Note [stage 3 beside mp]).

    ``state_dict()`` / :meth:`full_state_dict` give the single-process model's state (the slices gathered over
    the data mesh and over mp, collective); ``load_state_dict`` / :meth:`load_full_state_dict` take it back, each
    rank keeping its shard of its slice. ``fleet.distributed_optimizer`` rebuilds an optimizer over the shards.

    Example::

        model = HybridStage3(TPModel(), fleet.get_hybrid_communicate_group())
    """

    def __init__(self, layers: nn.Module, hcg: Any, param_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype | None = None, wrap: Sequence[str] | None = None) -> None:
        mp_group = hcg.get_model_parallel_group()
        with torch.no_grad():  # one starting model: replicated parameters over mp, everything over dp x sharding
            broadcast_coalesced([p.data for p in layers.parameters() if not is_split(p)], mp_group)
            broadcast_coalesced([t.data for t in [*layers.parameters(), *layers.buffers()]],
                                hcg.get_data_sharding_parallel_group())
        tags = {n: {a: getattr(p, a) for a in _TAGS if hasattr(p, a)} for n, p in layers.named_parameters()}
        mesh = data_mesh(hcg)
        super().__init__(layers, stage=3, param_dtype=param_dtype, reduce_dtype=reduce_dtype, wrap=wrap, mesh=mesh)
        self._hcg = hcg
        _retag(self._layers, tags, mesh.get_group(), data_mp_mesh(hcg))

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the gradients by the full model's global norm (each element once over data, sharding and mp: the
        one gradient rule)."""
        return clip_by_global_norm(self.parameters(), max_norm, GradGroups.of(self._hcg), norm_type=norm_type)

    def full_state_dict(self, rank0_only: bool = False) -> dict[str, torch.Tensor]:
        """The single-process model's state (Note [hybrid full state]): collective over data × sharding and mp."""
        return hybrid_state.full_state_dict(self._layers, rank0_only=rank0_only)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        """Load the single-process model's state (plain tensors, every rank) or this model's DTensor shards."""
        from torch.distributed.tensor import DTensor  # ~0.5 s, on use

        if any(isinstance(v, DTensor) for v in state_dict.values()):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        return hybrid_state.load_full_state_dict(self._layers, state_dict, strict=strict)

    def state_layout(self) -> Any:
        """How this rank's state sits in the full model's (the ``WrappedModel`` protocol; Note [hybrid full state])."""
        return hybrid_state.state_layout(self._layers)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mp={self._hcg.get_model_parallel_world_size()}"


def distributed_stage3(model: nn.Module, strategy: Any, hcg: Any) -> HybridStage3:
    """``fleet.distributed_model``'s last step for sharding stage 3 beside mp: amp's dtype is FSDP2's parameter
    dtype, ``fp16_allreduce``'s its reduction dtype, as for plain stage 3."""
    from .. import amp

    param_dtype = amp.DTYPES[strategy.amp_configs["dtype"]] if strategy.amp else None
    reduce_dtype = amp.DTYPES[strategy.fp16_allreduce_configs["dtype"]] if strategy.fp16_allreduce else (
        torch.float32 if param_dtype is not None else None)
    return HybridStage3(model, hcg, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                        wrap=strategy.sharding_configs["wrap"] or None)


# Note [stage 3 beside pp]
# torchtitan's pp + FSDP (``parallelize.py``'s ``apply_fsdp`` on each stage's module, ``pipeline_parallel.py``):
# each rank's stage (the ``PipelineLayer``) is ``fully_shard``-ed over the 1-D mesh of its data × sharding ranks
# (:func:`data_mesh`: the ranks holding the same stage and reading other data) before torch's ``PipelineStage``
# wraps it. The stage knows FSDP2 modules: it keeps the unsharded gradients over the micro-batches and has FSDP2
# reduce-scatter them, averaged over data × sharding, after the last backward; so the pipeline's own
# data-parallel all-reduce is skipped (Note [pipeline gradients]), its division by the number of micro-batches
# applies to the shards, and the global norm adds each shard over its data mesh, then over the pipe group (the one
# gradient rule). Parameters are kept unsharded between the micro-batches' forward and backward
# (``reshard_after_forward=False``, torchtitan's choice under pp). Every parameter and buffer is broadcast over
# data × sharding first, so the ranks start from the same stage.
#
# Note [stage 3 beside pp and mp]
# 3-D (e.g. pp2 × mp2 × sharding2 on 8 ranks): a stage holding tensor-parallel layers is sharded as above, each
# slice a whole tensor to FSDP2 (as in Note [stage 3 beside mp]). The stage's replicated parameters are broadcast
# over mp before sharding, and FSDP2's new parameters get the slices' tags back (``split_axis``, ``mp_group``) and
# the (data × sharding, mp) mesh, so the global norm adds a shard over its data mesh, a slice over mp and a stage
# over pp, and the full state gathers over the data mesh, mp and the pipe (Note [hybrid full state]).


def wants_stage3_pipeline(hcg: Any, strategy: Any) -> bool:
    """True where a pipeline's stages are sharded by FSDP2 (sharding stage 3 beside pp: Note [stage 3 beside pp])."""
    return hcg is not None and strategy is not None and strategy.sharding_stage == 3


def shard_pipeline_stage(layers: nn.Module, hcg: Any) -> Any:
    """``fully_shard`` this rank's stage over its data × sharding mesh (Note [stage 3 beside pp]); broadcasts
    the stage's parameters and buffers over that group first. Beside mp too (Note [stage 3 beside pp and mp]) the
    stage's replicated parameters are broadcast over mp first and its slices keep their tags. Returns the mesh's
    process group."""
    from torch.distributed.fsdp import fully_shard  # FSDP2: only when used

    with torch.no_grad():  # one starting stage: replicated parameters over mp (a no-op at mp 1), all over data
        broadcast_coalesced([p.data for p in layers.parameters() if not is_split(p)], hcg.get_model_parallel_group())
        broadcast_coalesced([t.data for t in [*layers.parameters(), *layers.buffers()]],
                            hcg.get_data_sharding_parallel_group())
    tags = {n: {a: getattr(p, a) for a in _TAGS if hasattr(p, a)} for n, p in layers.named_parameters()}
    mesh = data_mesh(hcg)
    fully_shard(layers, mesh=mesh, reshard_after_forward=False)
    group = mesh.get_group()
    _retag(layers, tags, group, data_mp_mesh(hcg))
    return group
