"""``strategy.lars``: LARS momentum as Paddle's ``LarsMomentumOptimizer`` computes it, applied in eager mode.

Paddle's dygraph fleet ignores ``strategy.lars``; its static-graph
meta-optimizer (``meta_optimizers/lars_optimizer.py``) replaces a Momentum
optimizer with ``LarsMomentumOptimizer`` (same learning rate and momentum).
fleetlite does the same in eager mode when the inner optimizer is
``torch.optim.SGD`` with ``momentum > 0``; with another optimizer (Adam, plain
SGD) LARS is not applied and a warning says so.

The update, per parameter ``w`` with gradient ``g`` (Paddle's
``lars_momentum`` kernel; the learning rate sits inside the velocity, as in
Paddle's Momentum)::

    local_lr = lr * coeff * ||w|| / (||g|| + wd * ||w|| + epsilon)   if wd > 0, ||w|| > 0, ||g|| > 0
             = lr                                                     otherwise
    velocity = mu * velocity + local_lr * (g + wd * w)
    w = w - velocity

``coeff``, ``wd`` and ``epsilon`` are ``lars_configs``' ``lars_coeff``,
``lars_weight_decay`` and ``epsilon``; ``wd`` is 0 for a parameter whose name
contains an entry of ``exclude_from_weight_decay`` (Paddle's substring match).
Under tensor parallelism the norms are the whole tensor's, summed over the model-parallel group (Note
[layer-wise norms under mp] in ``_common``). The SGD's own ``weight_decay`` is an L2 term added to ``g`` first (Paddle's
``regularization``); ``nesterov`` and ``dampening`` have no LARS form and are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._common import ParamNames, SharedGroupsOptimizer, SliceNorms

__all__ = ["LarsMomentum"]


class LarsMomentum(SharedGroupsOptimizer):
    """Paddle's LARS momentum over the parameter groups of a ``torch.optim.SGD`` with momentum.

    Example::

        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        lars = LarsMomentum(sgd, lars_coeff=0.001, lars_weight_decay=0.0005)
        loss.backward(); lars.step()
    """

    def __init__(self, inner: torch.optim.Optimizer, lars_coeff: float = 0.001, lars_weight_decay: float = 0.0005,
                 epsilon: float = 0.0, exclude_from_weight_decay: list[str] | tuple[str, ...] = (),
                 names: ParamNames | None = None, mp_group: Any = None) -> None:
        for g in inner.param_groups:
            if g.get("nesterov") or g.get("dampening"):
                raise NotImplementedError("strategy.lars with SGD(nesterov=True) or dampening != 0: Paddle's LARS "
                                          "momentum has neither; build SGD without them or turn strategy.lars off")
        if any(g.get("maximize") for g in inner.param_groups):
            raise NotImplementedError("strategy.lars with maximize=True is not supported; minimise the negated "
                                      "objective or turn strategy.lars off")
        self.inner = inner
        self.lars_coeff, self.lars_weight_decay, self.epsilon = float(lars_coeff), float(lars_weight_decay), float(
            epsilon)
        self.exclude = list(exclude_from_weight_decay)
        self.names = names if names is not None else ParamNames()
        self.mp_group = mp_group  # Note [layer-wise norms under mp]
        super().__init__(inner.param_groups, {})

    def _decay(self, p: torch.Tensor) -> float:
        if self.exclude and any(e in self.names.name(p, "lars_configs") for e in self.exclude):
            return 0.0
        return self.lars_weight_decay

    def _update(self, p: torch.Tensor, g: torch.Tensor, lr: float, mu: float, wd: float, vel: torch.Tensor,
                w_norm: torch.Tensor, g_norm: torch.Tensor) -> None:
        local_lr = torch.full_like(w_norm, lr)
        if wd > 0:
            scaled = lr * self.lars_coeff * w_norm / (g_norm + wd * w_norm + self.epsilon)
            local_lr = torch.where((w_norm > 0) & (g_norm > 0), scaled, local_lr)
        vel.mul_(mu).add_((g + wd * p) * local_lr)
        p.sub_(vel)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        slices = SliceNorms(self.mp_group)
        for group in self.param_groups:
            lr, mu, l2 = float(group["lr"]), float(group["momentum"]), float(group.get("weight_decay", 0.0))
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad if not l2 else p.grad.add(p, alpha=l2)
                st = self.state[p]
                if "velocity" not in st:
                    st["velocity"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                wd = self._decay(p)
                if wd > 0 and slices.wants(p):  # Note [layer-wise norms under mp]
                    slices.add(p, g, lr, mu, wd, st["velocity"])
                    continue
                self._update(p, g, lr, mu, wd, st["velocity"], torch.linalg.vector_norm(p), torch.linalg.vector_norm(g))
        for (p, g, lr, mu, wd, vel), w_norm, g_norm in slices.finish():
            self._update(p, g, lr, mu, wd, vel, w_norm, g_norm)
        return loss
