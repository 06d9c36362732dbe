"""Paddle's meta-optimizers, applied in eager mode: ``lamb``, ``lars``, ``localsgd``, ``adaptive_localsgd``, ``dgc``.

Paddle's dygraph fleet ignores these strategy flags (only its static-graph
meta-optimizers apply them); fleetlite applies them in eager mode.
``fleet.distributed_optimizer`` calls :func:`apply` to pick the optimizer that
really steps, and ``DistributedOptimizer.attach_model`` calls
:meth:`MetaOptimizers.attach` for what needs the model (the comm hooks of local
SGD and DGC). Each module's docstring states its formula and where it differs
from Paddle. As in Paddle, a meta-optimizer whose inner optimizer does not fit
is not applied, with a warning saying so.
"""

from __future__ import annotations

import torch

from ....parallel.sharded.rebuild import report_steps_to
from ....utils.user_warning import warn_user
from ._names import ParamNames
from .lamb import Lamb
from .lars import LarsMomentum

__all__ = ["Lamb", "LarsMomentum", "ParamNames", "MetaOptimizers"]


def _is_momentum_sgd(opt: torch.optim.Optimizer) -> bool:
    return isinstance(opt, torch.optim.SGD) and any(float(g.get("momentum", 0)) > 0 for g in opt.param_groups)


class MetaOptimizers:
    """The meta-optimizers a strategy turns on, for one ``DistributedOptimizer``.

    ``optimizer`` is what steps (the user's optimizer, or Lamb/LarsMomentum over its groups).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, strategy) -> None:
        self.names = ParamNames()
        self.optimizer = optimizer
        self.applied: list[str] = []
        s = strategy
        if (s.lamb or s.lars) and s.sharding:
            raise NotImplementedError("strategy.lamb / strategy.lars with strategy.sharding: the sharded optimizer "
                                      "is rebuilt from the optimizer's class; turn one of them off")
        if s.lamb and s.lars:
            raise NotImplementedError("strategy.lamb and strategy.lars together: each replaces the optimizer "
                                      "(Paddle applies only one); turn one off")
        if s.lamb:
            if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
                cfg = s.lamb_configs
                self.optimizer = Lamb(optimizer, cfg["lamb_weight_decay"], cfg["exclude_from_weight_decay"],
                                      self.names)
                self.applied.append("lamb")
            else:
                warn_user(f"strategy.lamb is on but the optimizer is {type(optimizer).__name__}: LAMB needs Adam or "
                          "AdamW (as in Paddle) and is not applied")
        if s.lars:
            if _is_momentum_sgd(optimizer):
                cfg = s.lars_configs
                self.optimizer = LarsMomentum(optimizer, cfg["lars_coeff"], cfg["lars_weight_decay"], cfg["epsilon"],
                                              cfg["exclude_from_weight_decay"], self.names)
                self.applied.append("lars")
            else:
                warn_user(f"strategy.lars is on but the optimizer is {type(optimizer).__name__} without momentum or "
                          "not SGD: LARS needs torch.optim.SGD with momentum > 0 (Paddle's Momentum) and is not "
                          "applied")
        if self.optimizer is not optimizer:  # a scheduler on the user's optimizer must not warn it never stepped
            report_steps_to(optimizer, self.optimizer)

    def attach(self, model: torch.nn.Module) -> None:
        """Learn the model's parameter names (``exclude_from_weight_decay``)."""
        self.names.add_model(model)
