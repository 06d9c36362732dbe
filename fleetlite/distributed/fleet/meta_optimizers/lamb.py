"""``strategy.lamb``: LAMB as Paddle's ``LambOptimizer`` computes it, applied in eager mode.

Paddle's dygraph fleet ignores ``strategy.lamb``; its static-graph
meta-optimizer (``meta_optimizers/lamb_optimizer.py``) replaces an Adam
optimizer with ``paddle.optimizer.Lamb`` over the same parameters, learning
rate, betas and epsilon. fleetlite does the same in eager mode: with
``strategy.lamb`` on and an ``torch.optim.Adam``/``AdamW`` inner optimizer,
``fleet.distributed_optimizer`` steps :class:`Lamb` instead. With another
optimizer LAMB is not applied and a warning says so (Paddle logs the same).

The update, per parameter ``w`` with gradient ``g`` at step ``t`` (Paddle's
``lamb`` kernel)::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    r = (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps) + wd * w
    w = w - lr * (||w|| / ||r|| if ||w|| > 0 and ||r|| > 0 else 1) * r     if wd > 0
    w = w - lr * r                                                           if wd == 0

``wd`` is ``lamb_configs['lamb_weight_decay']``, and 0 for a parameter whose
name ends with an entry of ``lamb_configs['exclude_from_weight_decay']``
(Paddle's meta-optimizer matches ``param.name.endswith``; names are the model's ``named_parameters``). A
parameter without decay gets no trust ratio either (``paddle.optimizer.Lamb``'s ``always_adapt=False``, which
its meta-optimizer keeps). Under tensor parallelism the norms are the whole tensor's, summed over the
model-parallel group (Note [layer-wise norms under mp] in ``_common``).
The inner optimizer's own ``weight_decay`` is not used (Paddle builds Lamb with
``weight_decay=None``); ``amsgrad`` has no LAMB form and is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._common import ParamNames, SharedGroupsOptimizer, SliceNorms, trust_ratio

__all__ = ["Lamb"]


class Lamb(SharedGroupsOptimizer):
    """Paddle's LAMB over the parameter groups of an Adam/AdamW optimizer (the same group dicts).

    Learning rate, betas and eps are read from each group at every step, so a
    scheduler built on the original optimizer still drives them.

    Example::

        adam = torch.optim.Adam(model.parameters(), lr=1e-3)
        lamb = Lamb(adam, lamb_weight_decay=0.01)
        loss.backward(); lamb.step()
    """

    def __init__(self, inner: torch.optim.Optimizer, lamb_weight_decay: float = 0.01,
                 exclude_from_weight_decay: list[str] | tuple[str, ...] = (),
                 names: ParamNames | None = None, mp_group: Any = None) -> None:
        if any(g.get("amsgrad") for g in inner.param_groups):
            raise NotImplementedError("strategy.lamb with Adam(amsgrad=True): LAMB has no AMSGrad form; build the "
                                      "optimizer with amsgrad=False or turn strategy.lamb off")
        if any(g.get("maximize") for g in inner.param_groups):
            raise NotImplementedError("strategy.lamb with maximize=True is not supported; minimise the negated "
                                      "objective or turn strategy.lamb off")
        self.inner = inner
        self.lamb_weight_decay = float(lamb_weight_decay)
        self.exclude = list(exclude_from_weight_decay)
        self.names = names if names is not None else ParamNames()
        self.mp_group = mp_group  # Note [layer-wise norms under mp]
        super().__init__(inner.param_groups, {})

    def _decay(self, p: torch.Tensor) -> float:
        if self.exclude and any(self.names.name(p, "lamb_configs").endswith(e) for e in self.exclude):
            return 0.0
        return self.lamb_weight_decay

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        slices = SliceNorms(self.mp_group)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps = float(group["lr"]), float(group["eps"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = torch.zeros((), dtype=torch.float32)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["step"] += 1
                t = float(st["step"])
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                r = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps)
                wd = self._decay(p)
                if not wd:  # Paddle's always_adapt=False: no decay, no trust ratio
                    p.sub_(r * lr)
                    continue
                r.add_(p, alpha=wd)
                if slices.wants(p):  # Note [layer-wise norms under mp]
                    slices.add(p, r, lr)
                    continue
                p.sub_(r * (lr * trust_ratio(torch.linalg.vector_norm(p), torch.linalg.vector_norm(r))))
        for (p, r, lr), w_norm, r_norm in slices.finish():
            p.sub_(r * (lr * trust_ratio(w_norm, r_norm)))
        return loss
