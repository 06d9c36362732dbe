"""Parameter names for ``exclude_from_weight_decay``: Paddle matches ``param.name``, torch tensors have none.

The names come from the models the optimizer meets (``fleet.distributed_model``
links them, :meth:`ParamNames.add_model`); a wrapper's prefix (``_layers.``,
``module.``) is stripped so ``'fc.bias'`` names what the user's module calls it.
"""

from __future__ import annotations

import torch
import torch.nn as nn

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
