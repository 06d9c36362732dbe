"""Full optimizer state of a sharded (FSDP2) model in torch's own index-keyed format, and back.

``get_optimizer_state_dict(full_state_dict=True)`` keys the state by
parameter names; a plain optimizer's ``state_dict()`` keys it by the
parameter's position across the parameter groups. Checkpoints hold the
latter, so a state written at stage 3 loads into a plain optimizer (one
process, DDP, stage 1) and the other way round. Beside tensor parallelism (stage 3 next to mp) the state of
each tensor-parallel slice is gathered over its mp group too, so the state is the single-process optimizer's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

__all__ = ["full_optimizer_state", "load_full_optimizer_state"]


def _fqns(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError("the optimizer steps a parameter that is not in the sharded model; build it over "
                                 "the model's parameters")
            out.append(names[id(p)])
    return out


def _slices(module: nn.Module) -> dict[str, nn.Parameter]:
    """The tensor-parallel slices among ``module``'s sharded parameters, by name (Note [stage 3 beside mp]):
    their optimizer state is gathered over the mp group as well, and split over it on load."""
    return {n: p for n, p in module.named_parameters() if getattr(p, "split_axis", None) is not None}


def _mp_part(value: Any, param: nn.Parameter) -> Any:
    """This mp rank's part of a full state tensor of a tensor-parallel slice (``value`` as it is otherwise)."""
    n = tdist.get_world_size(param.mp_group)
    if not torch.is_tensor(value) or value.dim() != param.dim() or value.shape[param.split_axis] != \
            param.shape[param.split_axis] * n:
        return value
    return value.chunk(n, dim=param.split_axis)[tdist.get_rank(param.mp_group)]


def full_optimizer_state(sharded: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """Collective: the full state on rank 0 (on CPU, index-keyed as torch's ``state_dict()``), None elsewhere."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict  # ~0.5 s; on use

    module = sharded.module
    slices = _slices(module)
    # beside tensor parallelism every rank needs its slices' state whole, to gather it over mp
    by_name = get_optimizer_state_dict(module, optimizer,
                                       options=StateDictOptions(full_state_dict=True, cpu_offload=not slices))
    for name in sorted(slices):  # the same order on every rank: the gathers pair up
        param, entry = slices[name], by_name["state"].get(name, {})
        for key in sorted(entry):
            value = entry[key]
            if torch.is_tensor(value) and value.shape == param.shape:
                parts = [torch.empty_like(value) for _ in range(tdist.get_world_size(param.mp_group))]
                tdist.all_gather(parts, value.contiguous(), group=param.mp_group)
                entry[key] = torch.cat(parts, dim=param.split_axis).cpu()
    if tdist.get_rank() != 0:
        return None
    index = {name: i for i, name in enumerate(_fqns(module, optimizer))}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in g["params"]]}
              for g in by_name["param_groups"]]
    return {"state": {index[n]: s for n, s in by_name["state"].items()}, "param_groups": groups}


def load_full_optimizer_state(sharded: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load an index-keyed full state (every rank holds it) into the sharded optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict  # ~0.5 s; on use

    module = sharded.module
    names = _fqns(module, optimizer)
    groups = state["param_groups"]
    count = sum(len(g["params"]) for g in groups)
    if count != len(names) or len(groups) != len(optimizer.param_groups):
        raise ValueError(f"the optimizer state holds {count} parameters in {len(groups)} groups, this optimizer "
                         f"{len(names)} in {len(optimizer.param_groups)}: it was saved for another model/optimizer")
    # cloned: torch may keep views of the given tensors as the shards, which would alias the caller's state
    slices = _slices(module)
    by_name = {"state": {names[int(i)]: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                         for i, s in state["state"].items()},
               "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                 "params": [names[int(i)] for i in g["params"]]} for g in groups]}
    for name, entry in by_name["state"].items():
        if name in slices:  # beside tensor parallelism: this rank's slice of the state
            by_name["state"][name] = {k: _mp_part(v, slices[name]) for k, v in entry.items()}
    set_optimizer_state_dict(module, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
