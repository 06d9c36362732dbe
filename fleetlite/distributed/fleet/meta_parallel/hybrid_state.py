"""The full weights of a hybrid-parallel model, and its reshardable DCP state: what ``TensorParallel`` and
``PipelineParallel`` answer for the ``WrappedModel`` protocol and what a Trainer checkpoint of them holds.

# Note [hybrid full state]
Every tensor of a rank is a piece of the full tensor as its DTensor placements on the mp mesh say
(:func:`~.mp_layers.placements_of`: a slice is ``Shard(split_axis)``, the rest ``Replicate()``), and one
pipeline stage holds the entries of its own layers, named by global layer index, plus the
``shared_layers.<key>`` copies it shares with other stages (any other module is one stage holding every
layer). The *full state* is the single-process model's: every tensor's view
(:func:`~.sharded_state.global_view`) made whole (``full_tensor()``: a slice gathered over its mp group),
then every stage's entries gathered over the pipeline group (a shared weight once: its copies are equal);
for a pipeline exactly the state of ``PipelineLayer(the same descs, num_stages=1)``. Loading one is the
reverse: each rank keeps its piece (``distribute_tensor`` with the same placements: ``torch.chunk``, as the
layers slice at construction) of the entries of its own stage.

# Note [hybrid DCP state]
In a DCP checkpoint the model goes in as :func:`~.sharded_state.sharded_state_dict` (every tensor as its
``DTensor`` view: DCP writes a slice's pieces and a replicated tensor once) and the optimizer in torch's
*flattened* form (``state.<fqn>.exp_avg``, ``param_groups.<fqn>.lr``: ``StateDictOptions(
flatten_optimizer_state_dict=True)``), each state tensor viewed like its parameter. Flattened, every key
belongs to one parameter, so each pipeline stage writes the keys of its own parameters (the nested form keeps
all parameter groups under one key, which stages would overwrite with their own); data-parallel replicas and
the stages sharing a weight hold equal values under the same key, written once. A layer shared by several
stages (``SharedLayerDesc``) is written by its first holder alone (``is_firstly_shared``): only its shared
weight is kept equal across stages, and its other parameters (a bias) are the first holder's, as in the full
state. Any layout reads it back: another mp or pp degree, more or fewer data-parallel replicas, or one process
(DCP reshards). Under sharding stage 1 (a ``ZeroRedundancyOptimizer``) each rank's partition optimizer writes
the keys of its own parameters (Note [stage 1 in DCP]) and a load fills them alike, then gives the loaded
hyperparameters to the groups the user's LR scheduler drives.

Example::

    full = full_state_dict(stage, pp_group=pp.pp_group)       # collective; the single-process model's keys
    load_full_state_dict(stage, full)                         # this rank's slices of its stage's entries
    state = dcp_state(stage, optimizer)                       # {"model": ..., "optim": ...} for dcp.save/load
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as td
from torch import nn

from ....parallel.wrapped import StateLayout
from .. import context
from .mp_layers import placements_of
from .sharded_state import _group_of, _mesh_of, _torch_optimizer, global_view, sharded_state_dict, view_like

__all__ = ["is_hybrid_module", "state_layout", "degrees_of", "full_state_dict", "load_full_state_dict", "dcp_state",
           "load_dcp_state", "has_flat_optimizer", "flat_optimizer_state", "load_flat_optimizer_state",
           "full_optimizer_state", "load_full_optimizer_state"]

_FLAT = "flatten_optimizer_state_dict"


def _stage(module: nn.Module) -> tuple[Any, int, int, int]:
    """(the stage of a layer index, this rank's stage, the number of stages, the number of layers) of ``module``
    as a pipeline: a ``PipelineLayer``'s own (duck-typed: pipeline/ imports this module), and for any other
    module one stage holding every layer."""
    return (getattr(module, "get_stage_from_index", lambda index: 0), getattr(module, "get_stage_id", lambda: 0)(),
            getattr(module, "get_num_stages", lambda: 1)(), getattr(module, "_num_layers", 0))


def is_hybrid_module(module: nn.Module) -> bool:
    """True for a model whose ranks hold different parts of it: tensor-parallel slices or one pipeline stage.

    Example::

        is_hybrid_module(tp_model._layers), is_hybrid_module(torch.nn.Linear(2, 2))     # True, False
    """
    return _stage(module)[2] > 1 or any(p.is_shard() for t in module.parameters() for p in placements_of(t))


def state_layout(module: nn.Module) -> StateLayout:
    """What a hybrid wrapper answers for the ``WrappedModel`` protocol's ``state_layout``: partial where ranks
    hold different parts of ``module`` (:func:`is_hybrid_module`), the parallel plan's checkpoint degrees.

    Example::

        state_layout(tp_model._layers)      # StateLayout(partial=True, degrees={'dp': 1, 'mp': 2, 'pp': 1})
    """
    return StateLayout(is_hybrid_module(module), degrees_of(module))


def _whole(t: Any) -> Any:
    """A tensor's view (:func:`~.sharded_state.global_view`) whole on this rank: ``full_tensor()`` (collective over
    the mp group, and the data mesh under stage 3; none when replicated); anything else as it is."""
    return t.full_tensor().detach() if hasattr(t, "full_tensor") else t


def full_state_dict(module: nn.Module, rank0_only: bool = False, pp_group: Any = None) -> dict[str, torch.Tensor]:
    """The single-process model's state of a hybrid ``module`` (Note [hybrid full state]); collective over the mp
    group (and ``pp_group`` for a pipeline stage). ``rank0_only``: ranks other than global rank 0 get ``{}``.

    Example::

        full = full_state_dict(tp_model._layers)                    # mp slices gathered
    """
    meshes: dict[int, Any] = {}
    out = {k: _whole(global_view(v, meshes=meshes) if isinstance(v, torch.Tensor) else v)
           for k, v in module.state_dict(keep_vars=True).items()}
    out = _merge_over(pp_group, out, order=_layer_order)  # a shared weight's copies are equal: the first stage's
    if rank0_only and td.is_initialized() and td.get_rank() != 0:
        return {}
    return out


def _layer_order(key: str) -> tuple[int, str]:
    head = key.split(".", 1)[0]
    return (int(head), key) if head.isdigit() else (-1, key)


def _other_stage(module: nn.Module, key: str) -> bool:
    """A key of another stage of ``module``'s pipeline: a layer index it places on another stage, or a copy of a
    shared layer that it does not hold."""
    stage_of, mine, stages, layers = _stage(module)
    head = key.split(".", 1)[0]
    if head.isdigit():
        return 0 <= int(head) < layers and stage_of(int(head)) != mine
    return stages > 1 and key.startswith("shared_layers.")


def _mp_part(key: str, value: torch.Tensor, target: torch.Tensor, meshes: dict[int, Any]) -> torch.Tensor:
    """This rank's piece of the full tensor ``value`` along the mp dimension, as ``target`` is placed
    (:func:`~.mp_layers.placements_of`: ``chunk(mp)[mp_rank]`` of a slice, all of a replicated tensor)."""
    from torch.distributed.tensor import distribute_tensor

    mesh, placements = _mesh_of(_group_of(target), meshes, target.device.type), placements_of(target)
    full = list(target.shape)
    for p in placements:
        if p.is_shard():
            full[p.dim] *= mesh.size()
    if list(value.shape) != full:
        raise RuntimeError(f"{key}: the full tensor has shape {tuple(value.shape)}, but this model's is {tuple(full)} "
                           f"(this rank holds {tuple(target.shape)} of it, placed {placements} over {mesh.size()} "
                           "mp ranks); pass the full (single-process) state")
    return distribute_tensor(value.detach().to(target.device), mesh, placements, src_data_rank=None).to_local()


def _part(key: str, value: Any, target: Any, meshes: dict[int, Any]) -> Any:
    """This rank's part of the full tensor ``value``, laid out like ``target``: its mp piece (:func:`_mp_part`), and
    under stage 3 FSDP2's shard of that (a ``DTensor`` like the parameter: Note [stage 3 beside mp])."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not (isinstance(value, torch.Tensor) and isinstance(target, torch.Tensor)):
        return value
    piece = _mp_part(key, value, target, meshes)
    return distribute_tensor(piece, target.device_mesh, target.placements, src_data_rank=None) \
        if isinstance(target, DTensor) else piece


def load_full_state_dict(module: nn.Module, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
    """Load a full state (Note [hybrid full state]) into a hybrid ``module``: each rank keeps its part of its
    stage's entries. Not collective. ``strict``: a missing entry, or one that belongs to no stage, raises.

    Example::

        load_full_state_dict(tp_model._layers, single_process_model.state_dict())
    """
    own = module.state_dict(keep_vars=True)
    unexpected = [k for k in state_dict if k not in own and not _other_stage(module, k)]
    if strict and unexpected:
        raise RuntimeError(f"the full state has entries this model does not know: {sorted(unexpected)[:10]}; pass "
                           "the state of the same model (its single-process keys)")
    meshes: dict[int, Any] = {}
    mine = {key: _part(key, state_dict[key], target, meshes) for key, target in own.items() if key in state_dict}
    return module.load_state_dict(mine, strict=strict)


def has_flat_optimizer(keys: Iterable[str]) -> bool:
    """Whether a DCP checkpoint's keys hold the optimizer in torch's flattened form (Note [hybrid DCP state]):
    parameter-group entries without the nested form's ``optim.param_groups.<i>.params`` lists.

    Example::

        has_flat_optimizer(["optim.param_groups.1.weight.lr"])                          # True
        has_flat_optimizer(["optim.param_groups.0.lr", "optim.param_groups.0.params"])  # False
    """
    keys = list(keys)
    nested = any(re.fullmatch(r"optim\.param_groups\.\d+\.params(\.\d+)?", k) for k in keys)
    return not nested and any(k.startswith("optim.param_groups.") for k in keys)


def _options(flat: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**{_FLAT: flat})


def _stepping(optimizer: Any) -> tuple[Any, Any]:
    """(the torch optimizer whose state a rank holds, stage 1's ``ZeroRedundancyOptimizer`` or None)."""
    inner = _torch_optimizer(optimizer)
    return (inner.optim, inner) if hasattr(inner, "consolidate_state_dict") else (inner, None)


def flat_optimizer_state(module: nn.Module, optimizer: Any) -> dict[str, Any]:
    """This rank's optimizer state in torch's flattened form (stage 1: its partition's parameters, with the
    hyperparameters of the groups an LR scheduler drives: the partition gets them only at its next step)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    opt, zero = _stepping(optimizer)
    if zero is not None:
        for group, part in zip(zero.param_groups, opt.param_groups):
            part.update({k: v for k, v in group.items() if k != "params"})
    return get_optimizer_state_dict(module, opt, options=_options(True))


def load_flat_optimizer_state(module: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Load a flattened optimizer state (plain tensors) into ``optimizer``; under stage 1 into this rank's
    partition, whose loaded hyperparameters then go to the groups an LR scheduler drives."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    from ....parallel.sharded.rebuild import groups_kept

    opt, zero = _stepping(optimizer)
    with groups_kept(opt):  # Note [shared parameter groups]
        set_optimizer_state_dict(module, opt, state, options=_options(True))
    if zero is not None:
        for group, loaded in zip(zero.param_groups, opt.param_groups):
            group.update({k: v for k, v in loaded.items() if k != "params" and k in group})


def _merge_over(group: Any, entries: dict[str, Any], order: Any = None) -> dict[str, Any]:
    """Every rank's ``entries`` of ``group`` merged (the first rank's value where several hold a key; sorted by
    ``order`` if given); collective."""
    if group is None or td.get_world_size(group) == 1:
        return entries
    parts: list[Any] = [None] * td.get_world_size(group)
    td.all_gather_object(parts, {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in entries.items()},
                         group=group)
    merged: dict[str, Any] = {}
    for part in parts:
        for k, v in part.items():
            merged.setdefault(k, v)
    return {k: merged[k] for k in sorted(merged, key=order)} if order is not None else merged


def _param_of(key: str) -> str:
    """The parameter name of a flattened optimizer key: ``state.<fqn>.<name>`` / ``param_groups.<fqn>.<name>``."""
    return key.partition(".")[2].rpartition(".")[0]


def full_optimizer_state(module: nn.Module, optimizer: Any, pp_group: Any = None) -> dict[str, Any]:
    """The single-process model's optimizer state of a hybrid ``module``, in torch's flattened form (Note [hybrid
    full state], for the optimizer): each state tensor laid out like its parameter made whole like the parameter,
    every stage's keys gathered over ``pp_group``, and under sharding stage 1 every partition's keys over the
    sharding group. Collective; what Paddle's ``Model.save`` writes as ``.pdopt``. It loads into the same model
    in one process (``load_flat_optimizer_state``) or under any degrees (:func:`load_full_optimizer_state`).

    Example::

        full = full_optimizer_state(tp_model._layers, opt)      # state.<fqn>.exp_avg: full tensors
    """
    osd = flat_optimizer_state(module, optimizer)
    params, meshes = dict(module.named_parameters()), {}
    out = {}
    for key in sorted(osd):  # the same order on every rank of an mp group: their gathers pair up
        value, p = osd[key], params.get(_param_of(key))
        out[key] = _whole(view_like(p, value, meshes)) if key.startswith("state.") else value
    zero = _stepping(optimizer)[1]
    if zero is not None:
        out = _merge_over(zero.process_group, out)
    return _merge_over(pp_group, out)


def load_full_optimizer_state(module: nn.Module, optimizer: Any, state: Mapping[str, Any]) -> None:
    """Load a full flattened optimizer state (:func:`full_optimizer_state`, or the flattened state of the
    single-process model) into a hybrid ``module``'s optimizer: each rank keeps its piece of the state of its own
    stage's parameters. Not collective.

    Example::

        load_full_optimizer_state(tp_model._layers, opt, torch.load("m.pdopt", weights_only=True))
    """
    if not has_flat_optimizer("optim." + k for k in state):
        raise ValueError("the optimizer state is in torch's index-keyed form, which names no parameter, so it cannot "
                         "be split over tensor-parallel ranks or pipeline stages; save it from a hybrid run "
                         "(Model.save writes the full, parameter-named state) or load the weights only "
                         "(reset_optimizer=True)")
    owned = {id(p) for g in _stepping(optimizer)[0].param_groups for p in g["params"]}  # stage 1: a partition
    params = {n: p for n, p in module.named_parameters() if id(p) in owned}
    meshes: dict[int, Any] = {}
    mine: dict[str, Any] = {}
    for key, value in state.items():
        p = params.get(_param_of(key))
        if p is None:
            continue  # another stage's parameter, or another partition's
        whole = key.startswith("state.") and isinstance(value, torch.Tensor) and value.dim() == p.dim()
        mine[key] = _mp_part(key, value, p, meshes).clone() if whole and value.shape != p.shape else value
    load_flat_optimizer_state(module, optimizer, mine)


def dcp_state(module: nn.Module, optimizer: Any = None, flat: bool = True, writing: bool = False) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` of a hybrid ``module`` for DCP (Note [hybrid DCP state]); ``optim`` absent
    without an optimizer. ``flat=False``: the optimizer in torch's nested form (to read a checkpoint written so).
    ``writing``: the state to save (a shared layer's copies on later stages left out), else the one to load into.

    Example::

        dcp.save(dcp_state(stage, opt, writing=True), checkpoint_id="ckpt")
        state = dcp_state(stage, opt); dcp.load(state, checkpoint_id="ckpt"); load_dcp_state(stage, opt, state)
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    copies = {n for n, p in module.named_parameters() if getattr(p, "is_firstly_shared", True) is False} \
        if writing else set()
    state: dict[str, Any] = {"model": {k: v for k, v in sharded_state_dict(module).items() if k not in copies}}
    if optimizer is None:
        return state
    if not flat and _stepping(optimizer)[1] is not None:
        raise ValueError("a checkpoint in the nested optimizer form cannot be read into sharding stage 1 under "
                         "tensor/pipeline parallelism; load its weights only (reset_optimizer=True)")
    osd = flat_optimizer_state(module, optimizer) if flat else \
        get_optimizer_state_dict(module, _torch_optimizer(optimizer), options=_options(False))
    params, meshes = dict(module.named_parameters()), {}
    if flat:
        state["optim"] = {key: view_like(params.get(_param_of(key)), value, meshes) if key.startswith("state.")
                          else value for key, value in osd.items() if _param_of(key) not in copies}
    else:
        osd["state"] = {fqn: {k: view_like(params.get(fqn), v, meshes) for k, v in entry.items()}
                        for fqn, entry in osd["state"].items() if fqn not in copies}
        state["optim"] = osd
    return state


def _local_view(param: Any, value: Any) -> Any:
    """The inverse of :func:`~.sharded_state.global_view`: a loaded value as the parameter holds it, a local tensor,
    or under stage 3 a ``DTensor`` laid out like the parameter (Note [stage 3 beside mp])."""
    from torch.distributed.tensor import DTensor

    if not isinstance(value, DTensor):
        return value
    local = value.to_local()
    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                              stride=param.stride()) if isinstance(param, DTensor) else local


def _loaded_optimizer(module: nn.Module, optim: dict[str, Any], flat: bool) -> dict[str, Any]:
    """A loaded optimizer state (flattened, or nested: ``{"state": {fqn: {name: value}}, ...}``) as the
    parameters hold it (:func:`_local_view`)."""
    params = dict(module.named_parameters())
    if flat:
        return {key: _local_view(params.get(_param_of(key)), value) for key, value in optim.items()}
    return {**optim, "state": {fqn: {k: _local_view(params.get(fqn), v) for k, v in entry.items()}
                               for fqn, entry in optim["state"].items()}}


def load_dcp_state(module: nn.Module, optimizer: Any, state: dict[str, Any], flat: bool = True) -> None:
    """Put a :func:`dcp_state` that ``dcp.load`` filled back into ``module`` (and ``optimizer`` unless None).

    Example::

        state = dcp_state(stage, opt); dcp.load(state, checkpoint_id="ckpt"); load_dcp_state(stage, opt, state)
    """
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    from ....parallel.sharded.rebuild import groups_kept
    from .sharded_state import load_sharded_state_dict

    load_sharded_state_dict(module, state["model"])
    if optimizer is None or "optim" not in state:
        return
    optim = _loaded_optimizer(module, state["optim"], flat)
    if flat:
        load_flat_optimizer_state(module, optimizer, optim)
        return
    opt = _torch_optimizer(optimizer)
    with groups_kept(opt):  # Note [shared parameter groups]
        set_optimizer_state_dict(module, opt, optim, options=_options(False))


def degrees_of(module: nn.Module) -> dict[str, int]:
    """``{"dp", "mp", "pp"}`` of the run holding ``module`` (this rank's part of a hybrid model): the parallel
    plan's, sharding and sep folded into dp (``ParallelPlan.checkpoint_degrees``).

    Example::

        degrees_of(stage)          # {"dp": 2, "mp": 2, "pp": 2} on 8 ranks
    """
    plan = context.state.plan
    if plan is None:
        raise RuntimeError("degrees_of needs the parallel plan of fleet.init(); a hybrid model is built after "
                           "fleet.init(is_collective=True, strategy=s), call it first")
    return plan.checkpoint_degrees
