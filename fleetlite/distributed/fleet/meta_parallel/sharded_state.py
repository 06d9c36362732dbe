"""Reshardable checkpoints of tensor-parallel models: their state as ``DTensor`` shards for
``torch.distributed.checkpoint`` (DCP).

A tensor-parallel slice (Note [tensor-parallel parameters]) becomes ``DTensor.from_local(slice, mesh,
[Shard(split_axis)])`` on a 1-D mesh of its mp group, sharing the parameter's storage; replicated entries
stay plain tensors (DCP writes them once). DCP then saves each slice with its offset in the full tensor, and
loads into any layout: another mp degree, or a single-process model's plain full tensors.

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
from .mp_layers import is_split

__all__ = ["sharded_state_dict", "load_sharded_state_dict", "sharded_optimizer_state_dict",
           "load_sharded_optimizer_state_dict"]


#: a stage-3 slice's 2-D (data × sharding, mp) mesh (Note [stage 3 beside mp]), set by ``HybridStage3``
MESH_2D_ATTR = "stage3_data_mp_mesh"


def full_tensor_view(param: torch.Tensor, shard: torch.Tensor | None = None) -> torch.Tensor:
    """A stage-3 slice's shard as a ``DTensor`` of the *full* tensor on the (data × sharding, mp) mesh, sharing
    its storage: the slice is a ``Shard(split_axis)`` over mp, FSDP2's part of it a dim-0 chunk over data ×
    sharding (``_StridedShard`` when both are dim 0, as FSDP2 lays out its own 2-D parameters). DCP saves it with
    its offsets in the full tensor, so the checkpoint loads into one process or another layout. ``shard``: a
    tensor laid out like the parameter (its optimizer state, a DTensor on the same mesh) instead of it."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh = getattr(param, MESH_2D_ATTR)
    axis, mp = param.split_axis, mesh.size(1)
    placements = [_StridedShard(0, split_factor=mp), Shard(0)] if axis == 0 else [Shard(0), Shard(axis)]
    local = (param if shard is None else shard).to_local().detach()
    shape = list(param.shape)  # the slice's (FSDP2's global shape), times mp along split_axis: the full tensor's
    shape[axis] *= mp
    full = torch.Size(shape)
    return DTensor.from_local(local.clone() if local.storage_offset() else local, mesh, placements, run_check=False,
                              shape=full, stride=torch.empty(full, device="meta").stride())


def _mesh_of(group: Any, cache: dict[int, Any], device_type: str) -> Any:
    """The 1-D mesh of a slice's mp group: the parallel plan's ``mp`` dimension when the group is the plan's (one
    mesh for the run), else a mesh over the group given by hand (``mp_group=`` of a layer)."""
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
    """``model.state_dict()`` with every tensor-parallel slice as a ``DTensor`` shard (storage shared, except
    for a slice that is a view at an offset: Note [shard storage offset])."""
    from torch.distributed.tensor import DTensor, Shard

    meshes: dict[int, Any] = {}
    out: dict[str, Any] = {}
    for key, value in model.state_dict(keep_vars=True).items():
        if isinstance(value, DTensor) and is_split(value):  # a stage-3 shard of a slice
            out[key] = full_tensor_view(value)
        elif isinstance(value, torch.Tensor) and is_split(value):
            mesh = _mesh_of(value.mp_group, meshes, value.device.type)
            out[key] = DTensor.from_local(_local(value), mesh, [Shard(value.split_axis)], run_check=False)
        else:
            out[key] = value.detach() if isinstance(value, torch.Tensor) else value
    return out


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
    from torch.distributed.tensor import DTensor, Shard

    module = _unwrapped(model)
    osd = get_optimizer_state_dict(module, _torch_optimizer(optimizer), options=StateDictOptions(full_state_dict=False))
    params = dict(module.named_parameters())
    meshes: dict[int, Any] = {}
    for fqn, entry in list(osd["state"].items()):
        p = params.get(fqn)
        if p is None or not is_split(p):
            continue
        mesh = _mesh_of(p.mp_group, meshes, p.device.type)
        osd["state"][fqn] = {  # a new dict: torch's entries may be the optimizer's own
            name: DTensor.from_local(_local(value), mesh, [Shard(p.split_axis)], run_check=False)
            if isinstance(value, torch.Tensor) and value.shape == p.shape else value
            for name, value in entry.items()}
    return osd


def load_sharded_optimizer_state_dict(model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Load a state from :func:`sharded_optimizer_state_dict` (after ``dcp.load`` filled it) into ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    from torch.distributed.tensor import DTensor

    local = {"state": {fqn: {k: v.to_local() if isinstance(v, DTensor) else v for k, v in entry.items()}
                       for fqn, entry in state["state"].items()},
             "param_groups": state["param_groups"]}
    set_optimizer_state_dict(_unwrapped(model), _torch_optimizer(optimizer), local)
