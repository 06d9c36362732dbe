"""A model's and its optimizer's state in a checkpoint: checked before it is written or loaded, and as the
FQN-keyed state a DCP directory holds (loads into any world size or stage).

# Note [stage 1 in DCP]
Stage 1's ``ZeroRedundancyOptimizer`` is unknown to DCP, but each rank's
partition is a plain torch optimizer over a subset of the parameters
(``zero.optim``). Its state goes into the checkpoint in the same FQN-keyed
format as any other optimizer's (``get_optimizer_state_dict``), with the
global parameter groups, so each rank writes only its own partition's state
(no consolidation on rank 0) and the checkpoint loads into any world size
or stage like a DDP one.

# Note [hybrid checkpoints]
A tensor- or pipeline-parallel module (``is_hybrid_module``: tensor-parallel slices, or one stage of a
pipeline) goes into a DCP directory as its slices and stage entries, the optimizer in torch's flattened form
(Note [hybrid DCP state] in ``meta_parallel/hybrid_state.py``). Loading looks at what the directory holds
(``optim.param_groups`` as one entry: the nested form of the other strategies; per parameter: the flattened
form) and asks for the same form, so a hybrid checkpoint loads into a single process or a data-parallel run
and the reverse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..distributed.fleet.meta_parallel import hybrid_state
from ..parallel.sharded.rebuild import groups_kept
from .dcp import load, saved_keys, validate
from .files import CheckpointError

__all__ = ["app_state", "load_app_state", "optimizer_name", "check_optimizer", "check_finite"]


def _split(optimizer: Any) -> tuple[Any, Any]:
    """(the torch optimizer DCP describes, stage 1's ``ZeroRedundancyOptimizer`` or None)."""
    inner = getattr(optimizer, "inner_opt", optimizer)
    zero = inner if hasattr(inner, "consolidate_state_dict") else None
    return (zero.optim if zero is not None else inner), zero


def _names(module: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in module.named_parameters(remove_duplicate=False)}


def app_state(module: nn.Module, optimizer: Any, flat: bool | None = None, writing: bool = False) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` for DCP (``optim`` absent without an optimizer; Note [stage 1 in DCP],
    Note [hybrid checkpoints]). ``flat``: the optimizer in torch's flattened form (default: for hybrid modules);
    ``writing``: the state to save (else the one a load fills)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    hybrid = hybrid_state.is_hybrid_module(module)
    flat = hybrid if flat is None else flat
    if hybrid:
        return hybrid_state.dcp_state(module, optimizer, flat=flat, writing=writing)
    state = {"model": get_model_state_dict(module)}
    if optimizer is not None and flat:  # (stage 1: this rank's partition, Note [hybrid DCP state])
        state["optim"] = hybrid_state.flat_optimizer_state(module, optimizer)
    elif optimizer is not None:
        opt, zero = _split(optimizer)
        state["optim"] = get_optimizer_state_dict(module, opt)
        if zero is not None:  # every rank's parameters, the global hyperparameters (an LR schedule sets them)
            names = _names(module)
            state["optim"]["param_groups"] = [
                {**lg, **{k: v for k, v in g.items() if k != "params" and k in lg},
                 "params": [names[id(p)] for p in g["params"]]}
                for lg, g in zip(state["optim"]["param_groups"], zero.param_groups)]
    return state


def load_app_state(module: nn.Module, optimizer: Any, path: Path) -> None:
    """Load the model (and the optimizer, unless None) shards of the directory ``path`` (collective; a
    checkpoint of any strategy or hybrid degrees, Note [hybrid checkpoints])."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    validate(path)  # (a clear error before its keys are read)
    flat = optimizer is not None and hybrid_state.has_flat_optimizer(saved_keys(path))
    try:
        app = app_state(module, optimizer, flat=flat)
    except ValueError as e:
        raise CheckpointError(path, str(e)) from None
    hybrid = hybrid_state.is_hybrid_module(module)
    load(app, path, subset=hybrid)  # a pipeline stage reads its own layers' entries
    if hybrid:
        try:
            hybrid_state.load_dcp_state(module, optimizer, app, flat=flat)
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(path, f"does not fit this model/optimizer: {e}") from None
        return
    set_model_state_dict(module, app["model"])
    if optimizer is None:
        return
    if flat:
        hybrid_state.load_flat_optimizer_state(module, optimizer, app["optim"])
        return
    opt, zero = _split(optimizer)
    if zero is None:
        with groups_kept(opt):  # Note [shared parameter groups]
            set_optimizer_state_dict(module, opt, app["optim"])
        return
    saved, names = app["optim"], _names(module)  # into this rank's partition (Note [stage 1 in DCP])
    index, groups, state = 0, [], {}
    for lg, loaded in zip(opt.param_groups, saved["param_groups"]):
        ids = []
        for p in lg["params"]:
            if names[id(p)] in saved["state"]:
                state[index] = saved["state"][names[id(p)]]
            ids.append(index)
            index += 1
        groups.append({**{k: v for k, v in loaded.items() if k != "params"}, "params": ids})
    opt.load_state_dict({"state": state, "param_groups": groups})
    for g, loaded in zip(zero.param_groups, saved["param_groups"]):
        g.update({k: v for k, v in loaded.items() if k != "params" and k in g})


def optimizer_name(optimizer: Any) -> str | None:
    """``"torch.optim.adam.Adam"``: the class of the torch optimizer that steps (inside any wrapper)."""
    if optimizer is None:
        return None
    inner = getattr(optimizer, "inner_opt", optimizer)
    return f"{type(inner).__module__}.{type(inner).__qualname__}"


def check_finite(weights: dict[str, Any], path: Path) -> None:
    """Refuse (``CheckpointError``) weights holding NaN/inf: such a checkpoint never replaces ``latest.pt``."""
    bad = [k for k, v in weights.items()
           if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(path, f"not written: non-finite weights (NaN/inf) in {bad[:5]}"
                                    f"{' ...' if len(bad) > 5 else ''}; training diverged, and latest.pt keeps "
                                    "pointing at the last finite checkpoint. Add fleetlite.callbacks.TerminateOnNaN "
                                    "to stop at the first non-finite loss; try a lower learning rate")


def check_optimizer(path: str | Path, state: dict[str, Any], optimizer: Any, hint: str) -> None:
    """Refuse, naming both, a checkpoint whose optimizer state comes from another optimizer class.

    torch would load such a state silently and fail at the first step (``KeyError: 'momentum'``). Checkpoints
    that do not record the class are checked by their hyperparameter names.
    """
    saved_opt = state.get("optimizer")
    if optimizer is None or not isinstance(saved_opt, dict):
        return
    saved = (state.get("meta") or {}).get("optimizer")
    mine = optimizer_name(optimizer)

    def short(name: Any) -> str:
        return str(name).rsplit(".", 1)[-1]

    if saved is not None and saved != mine:
        raise CheckpointError(path, f"its optimizer state comes from {short(saved)} ({saved}) but this run's "
                                    f"optimizer is {short(mine)} ({mine}); {hint}")
    groups = saved_opt.get("param_groups") or []
    own = getattr(optimizer, "inner_opt", optimizer).param_groups
    if saved is None and groups and own:
        missing = sorted(set(own[0]) - set(groups[0]) - {"params"})
        if missing:
            raise CheckpointError(path, f"its optimizer state lacks the hyperparameters {missing} of this run's "
                                        f"optimizer {short(mine)} ({mine}): it was written by another optimizer "
                                        f"class; {hint}")
