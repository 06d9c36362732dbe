"""Reshardable checkpoints of tensor-parallel models: their state as ``DTensor`` shards for
``torch.distributed.checkpoint`` (DCP).

Every tensor becomes ``DTensor.from_local(t, mesh, placements_of(t))`` on the 1-D mesh of its mp group
(:func:`global_view`), sharing the parameter's storage: a tensor-parallel slice (Note [tensor-parallel
parameters]) is a ``Shard(split_axis)``, anything else a ``Replicate()`` that DCP writes once. DCP then saves
each slice with its offset in the full tensor, and loads into any layout: another mp degree, or a
single-process model's plain full tensors.

Example::

    import torch.distributed.checkpoint as dcp
    dcp.save(sharded_state_dict(model), checkpoint_id="ckpt")        # mp = 2
    sd = sharded_state_dict(model); dcp.load(sd, checkpoint_id="ckpt"); load_sharded_state_dict(model, sd)
    # single process: dcp.load(plain.state_dict(), ...) then plain.load_state_dict(...) gives the full weights
    osd = sharded_optimizer_state_dict(model, opt)     # the optimizer alike (torch's FQN-keyed format)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .. import context
from .mp_layers import placements_of

__all__ = ["global_view", "sharded_state_dict", "load_sharded_state_dict", "sharded_optimizer_state_dict",
           "load_sharded_optimizer_state_dict"]


#: a stage-3 tensor's 2-D (data × sharding, mp) mesh (Note [stage 3 beside mp]), set by ``HybridStage3``
MESH_2D_ATTR = "stage3_data_mp_mesh"


def global_view(param: torch.Tensor, value: torch.Tensor | None = None, meshes: dict[int, Any] | None = None) -> Any:
    """``param`` (or ``value``, a tensor laid out like it: its optimizer state) as a ``DTensor`` of the *full*
    (single-process) tensor, sharing its storage (Note [shard storage offset]): ``DTensor.from_local`` on the mp
    mesh with :func:`~.mp_layers.placements_of`, for every tensor alike (a replicated one is written once by
    DCP). Under stage 3 (Note [stage 3 beside mp]) the tensor is FSDP2's ``DTensor`` already, whose data
    placements compose with the mp one on the (data × sharding, mp) mesh. ``meshes``: a cache of 1-D meshes.

    Example::

        dcp.save({k: global_view(t) for k, t in model.state_dict(keep_vars=True).items()}, checkpoint_id="ckpt")
    """
    from torch.distributed.tensor import DTensor

    local = (param if value is None else value).detach()
    if isinstance(local, DTensor):
        mesh = getattr(param, MESH_2D_ATTR, None)
        return local if mesh is None else _data_mp_view(param, local, mesh)
    group = _group_of(param)
    return DTensor.from_local(_local(local), _mesh_of(group, {} if meshes is None else meshes, local.device.type),
                              placements_of(param), run_check=False)


def _data_mp_view(param: torch.Tensor, shard: Any, mesh: Any) -> Any:
    """A stage-3 tensor (FSDP2's dim-0 chunk over data × sharding of this rank's piece) as a ``DTensor`` of the
    full tensor on the (data × sharding, mp) mesh: FSDP2's dim-0 chunk composed with the mp placement
    (``_StridedShard`` when both split dim 0, as FSDP2 lays out its own 2-D parameters)."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    (piece,), n = placements_of(param), mesh.size(1)
    data = _StridedShard(0, split_factor=n) if piece == Shard(0) else Shard(0)
    # FSDP2's global shape is this rank's piece's; the full tensor is n pieces along a Shard dimension
    full = torch.Size(size * n if piece.is_shard(dim) else size for dim, size in enumerate(param.shape))
    local = shard.to_local()
    return DTensor.from_local(local.clone() if local.storage_offset() else local, mesh, [data, piece], run_check=False,
                              shape=full, stride=torch.empty(full, device="meta").stride())


def _group_of(param: torch.Tensor) -> Any:
    """The mp group ``param`` is placed over: its own (a layer's ``mp_group``), else the parallel plan's, else the
    world (a replicated tensor is the same on any group)."""
    import torch.distributed as td

    group, plan = getattr(param, "mp_group", None), context.state.plan
    if group is None and plan is not None and plan.mesh is not None:
        group = plan.group("mp")
    return td.group.WORLD if group is None else group


def _mesh_of(group: Any, cache: dict[int, Any], device_type: str) -> Any:
    """The 1-D mesh of a tensor's mp group: the parallel plan's ``mp`` dimension when the group is the plan's (one
    mesh for the run), else a mesh over the group (``mp_group=`` of a layer, or the world)."""
    from torch.distributed.device_mesh import DeviceMesh

    if id(group) not in cache:
        plan = context.state.plan
        if plan is not None and plan.built and plan.mesh is not None and plan.mesh.device_type == device_type \
                and plan.group("mp") is group:
            cache[id(group)] = plan.submesh("mp")
        else:
            cache[id(group)] = DeviceMesh.from_group(group, device_type)
    return cache[id(group)]


def _local(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a ``DTensor``'s local shard.

    # Note [shard storage offset]
    A slice can be a view into a larger storage (a chunk of the full weight: rank 1's rows start at an
    offset). ``DTensor.from_local`` gives the wrapper that storage offset, so the wrapper reports a non-zero
    ``data_ptr`` and DCP's asynchronous stager then tries to copy the wrapper's own (empty) storage and fails
    ("invalid python storage"). Such a slice goes in as a copy; the load copies back into the parameter
    (:func:`load_sharded_state_dict` copies whatever does not share the parameter's memory).
    """
    t = t.detach()
    return t.clone() if t.storage_offset() else t


def sharded_state_dict(model: nn.Module) -> dict[str, Any]:
    """``model.state_dict()`` with every tensor as its :func:`global_view` (storage shared, except for a slice
    that is a view at an offset: Note [shard storage offset])."""
    meshes: dict[int, Any] = {}
    return {key: global_view(value, meshes=meshes) if isinstance(value, torch.Tensor) else value
            for key, value in model.state_dict(keep_vars=True).items()}


def load_sharded_state_dict(model: nn.Module, state: dict[str, Any]) -> None:
    """Copy a state from :func:`sharded_state_dict` (after ``dcp.load`` filled it) into ``model``'s tensors."""
    from torch.distributed.tensor import DTensor

    own = model.state_dict(keep_vars=True)
    missing = sorted(set(own) - set(state))
    if missing:
        raise KeyError(f"the state lacks {missing[:5]}{' ...' if len(missing) > 5 else ''}; pass the dict that "
                       "sharded_state_dict(model) returned (and dcp.load filled)")
    with torch.no_grad():
        for key, target in own.items():
            value = state[key]
            local = value.to_local() if isinstance(value, DTensor) else value
            if isinstance(target, DTensor):  # a stage-3 shard: this rank's part (Note [stage 3 beside mp])
                target = target.to_local()
            if isinstance(target, torch.Tensor) and local.data_ptr() != target.data_ptr():
                target.copy_(local)


def _unwrapped(model: nn.Module) -> nn.Module:
    return getattr(model, "_layers", model)  # TensorParallel / DataParallel: the user's module, its own names


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    return getattr(optimizer, "inner_opt", optimizer)  # fleet.DistributedOptimizer: the optimizer that steps


def sharded_optimizer_state_dict(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """The optimizer state in torch's FQN-keyed format (``get_optimizer_state_dict``), each state tensor of a
    tensor-parallel slice (e.g. AdamW's ``exp_avg``) as a ``DTensor`` shard like the parameter, so DCP saves and
    reshards it with the model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    module = _unwrapped(model)
    osd = get_optimizer_state_dict(module, _torch_optimizer(optimizer), options=StateDictOptions(full_state_dict=False))
    meshes: dict[int, Any] = {}  # a new dict per parameter: torch's entries may be the optimizer's own
    osd["state"] = {fqn: {k: view_like(module.get_parameter(fqn), v, meshes) for k, v in entry.items()}
                    for fqn, entry in osd["state"].items()}
    return osd


def view_like(param: torch.Tensor | None, value: Any, meshes: dict[int, Any]) -> Any:
    """An optimizer state value laid out like ``param`` (AdamW's ``exp_avg``, not ``step``) as its
    :func:`global_view`; any other value as it is."""
    like = param is not None and isinstance(value, torch.Tensor) and value.shape == param.shape
    return global_view(param, value, meshes) if like else value


def load_sharded_optimizer_state_dict(model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Load a state from :func:`sharded_optimizer_state_dict` (after ``dcp.load`` filled it) into ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    from torch.distributed.tensor import DTensor

    local = {"state": {fqn: {k: v.to_local() if isinstance(v, DTensor) else v for k, v in entry.items()}
                       for fqn, entry in state["state"].items()},
             "param_groups": state["param_groups"]}
    set_optimizer_state_dict(_unwrapped(model), _torch_optimizer(optimizer), local)
