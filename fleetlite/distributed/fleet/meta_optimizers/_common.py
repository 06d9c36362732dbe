"""Parameter names for ``exclude_from_weight_decay``: Paddle matches ``param.name``, torch tensors have none.

The names come from the models the optimizer meets (``fleet.distributed_model``
links them, :meth:`ParamNames.add_model`); a wrapper's prefix (``_layers.``,
``module.``) is stripped so ``'fc.bias'`` names what the user's module calls it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ..gradients import tensor_norms
from ..meta_parallel.mp_layers import is_split

_PREFIXES = ("_layers.", "module.", "_orig_mod.")


class ParamNames:
    """``id(param) -> name`` for the parameters of the models added so far."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def add_model(self, model: nn.Module) -> None:
        for name, p in model.named_parameters():
            for prefix in _PREFIXES:
                while name.startswith(prefix):
                    name = name[len(prefix):]
            self._names.setdefault(id(p), name)

    def name(self, param: torch.Tensor, what: str) -> str:
        name = self._names.get(id(param))
        if name is None:
            raise ValueError(f"{what}['exclude_from_weight_decay'] matches parameters by name, but a parameter of "
                             f"shape {tuple(param.shape)} belongs to no model fleetlite has seen; wrap the model "
                             "with fleet.distributed_model before the first step (or leave the list empty)")
        return name


class SharedGroupsOptimizer(torch.optim.Optimizer):
    """An optimizer that steps over another optimizer's ``param_groups`` (the same dicts, ``self.inner``'s).

    A scheduler built on the user's optimizer keeps driving it. torch's
    ``load_state_dict`` builds new group dicts; they are copied back into the
    shared ones so the link survives a checkpoint load.
    """

    inner: torch.optim.Optimizer

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        for mine, theirs in zip(self.param_groups, self.inner.param_groups):
            theirs.update({k: v for k, v in mine.items() if k != "params"})
        self.param_groups = self.inner.param_groups


def trust_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where both are positive, else 1 (Paddle's LAMB and LARS kernels)."""
    return torch.where((num > 0) & (den > 0), num / den, torch.ones_like(num))


class SliceNorms:
    """Norms of whole tensors under tensor parallelism, for the per-parameter ratios of LAMB and LARS.

    # Note [layer-wise norms under mp]
    LAMB's trust ratio and LARS' local learning rate take ``||w||`` and the norm of each parameter's update
    (LAMB) or gradient (LARS) over the whole tensor. Under tensor parallelism (``mp_degree`` > 1) a slice
    (``split_axis``) holds a part of it on each model-parallel rank, so its squared norms are summed over the mp
    group first (one all-reduce per step for all the slices: ``gradients.tensor_norms``); replicated
    parameters are whole on every rank and take their own norms. The step defers the slices (:meth:`add`) and
    finishes them once :meth:`finish` has their whole-tensor norms.

    Example::

        norms = SliceNorms(hcg.get_model_parallel_group())
        if norms.wants(p):
            norms.add(p, r, lr)                      # (param, other tensor, anything the update needs)
        for (p, r, lr), w_norm, r_norm in norms.finish():
            ...
    """

    def __init__(self, mp_group: Any) -> None:
        self.group = mp_group
        self._deferred: list[tuple[Any, ...]] = []

    def wants(self, p: torch.Tensor) -> bool:
        """Whether ``p`` is a slice whose norms need the other mp ranks' parts."""
        return self.group is not None and is_split(p)

    def add(self, p: torch.Tensor, other: torch.Tensor, *rest: Any) -> None:
        self._deferred.append((p, other, *rest))

    def finish(self) -> list[tuple[tuple[Any, ...], torch.Tensor, torch.Tensor]]:
        """``(entry, ||p||, ||other||)`` of the whole tensors for every deferred entry (collective over mp)."""
        deferred, self._deferred = self._deferred, []
        if not deferred:
            return []
        tensors = [t for e in deferred for t in e[:2]]
        full = tensor_norms(tensors, [True] * len(tensors), self.group).view(-1, 2)  # Note [one gradient rule]
        return [(e, full[i, 0].to(e[0].dtype), full[i, 1].to(e[0].dtype)) for i, e in enumerate(deferred)]
