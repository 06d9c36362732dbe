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
