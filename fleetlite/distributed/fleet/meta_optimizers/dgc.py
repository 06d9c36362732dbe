"""``strategy.dgc``: Deep Gradient Compression in eager mode, a comm hook on the engine's buckets.

Paddle's dygraph fleet ignores ``strategy.dgc``; its static-graph
meta-optimizer (``meta_optimizers/dgc_optimizer.py``) swaps a Momentum
optimizer for ``DGCMomentumOptimizer``. fleetlite applies it in eager mode
when the inner optimizer is ``torch.optim.SGD`` with momentum and there is more
than one rank (otherwise a warning says it is not applied, as Paddle's
``_can_apply`` declines): the data-parallel model gets
:func:`fleetlite.parallel.dgc_hook.dgc_hook` (Note [DGC step] there: momentum
correction, optional local gradient clipping, top-k sparsification ramped up
from ``rampup_begin_step`` over ``rampup_step`` steps through ``sparsity``)
and :class:`DGCMomentum` steps.

Before ``rampup_begin_step`` the step is torch's SGD with momentum on densely
all-reduced gradients, identical to dense training. After it, compressed
gradients already hold the momentum and are applied as ``w -= lr * grad``;
the small parameters (under 16384 elements, Paddle's rule) keep dense
all-reduce and torch's momentum. The SGD's ``weight_decay`` is added to the
local gradient inside the hook (Paddle's L2 regularisation in its kernel).
``sparsity`` ``[]`` (the strategy's default) means Paddle's
``DGCMomentumOptimizer`` default ``[0.999]``. Local gradient clipping
(``local_grad_clip_norm``, Paddle's ``ClipGradByNorm`` on the optimizer) has
no strategy key; set ``opt.meta.dgc_state.local_grad_clip_norm``.
Under ``hybrid_configs`` DGC runs over the data-parallel group only (the
tensor-parallel model's engine reduces over it): with ``dp_degree`` 1 it is
not applied, with the warning one process gives; with ``pp_degree`` > 1 and
more than one data-parallel rank it is refused (the pipeline has no comm hook).
``nesterov``/``dampening``/``maximize``, fp16_allreduce, float16 amp (loss
scaling), sharding and the other meta-optimizers together with DGC are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ....parallel.dgc_hook import DGCState, dgc_hook
from ._common import SharedGroupsOptimizer

__all__ = ["DGCMomentum", "DGCState"]

_KEY = "fleet_dgc"


class DGCMomentum(SharedGroupsOptimizer):
    """The optimizer side of DGC over a ``torch.optim.SGD`` with momentum (the same group dicts).

    Example::

        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt = DGCMomentum(sgd, rampup_begin_step=10, rampup_step=5, sparsity=[0.9, 0.99])
        opt.attach(dp_model)           # registers the DGC comm hook
        loss.backward(); opt.step()
    """

    def __init__(self, inner: torch.optim.SGD, rampup_begin_step: int = 0, rampup_step: int = 1,
                 sparsity: list[float] | tuple[float, ...] = (), process_group=None) -> None:
        for g in inner.param_groups:
            if g.get("nesterov") or g.get("dampening"):
                raise NotImplementedError("strategy.dgc with SGD(nesterov=True) or dampening != 0 is not supported; "
                                          "build SGD without them or turn strategy.dgc off")
        momentum = {float(g["momentum"]) for g in inner.param_groups}
        if len(momentum) != 1:
            raise NotImplementedError(f"strategy.dgc needs one momentum for all parameter groups, got {momentum}")
        if any(g.get("maximize") for g in inner.param_groups):
            raise NotImplementedError("strategy.dgc with maximize=True is not supported; minimise the negated "
                                      "objective or turn strategy.dgc off")
        self.inner = inner
        self.dgc_state = DGCState(momentum.pop(), rampup_begin_step, rampup_step, sparsity, process_group=process_group)
        for g in inner.param_groups:
            for p in g["params"]:
                if g.get("weight_decay"):
                    self.dgc_state.l2[id(p)] = float(g["weight_decay"])
        self.attached = False
        super().__init__(inner.param_groups, {})
        self.state = inner.state  # one set of momentum buffers: torch SGD's (dense phase) and ours (after rampup)

    def attach(self, model: torch.nn.Module) -> None:
        """Register the DGC hook on the data-parallel model (once)."""
        if not self.attached:
            model.register_comm_hook(self.dgc_state, dgc_hook)
            self.attached = True

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self) -> dict[str, Any]:
        """torch SGD's state plus the hook's step count and ``u``/``v`` accumulators (by parameter index)."""
        state = super().state_dict()
        st, index = self.dgc_state, {id(p): i for i, p in enumerate(self._params())}
        state[_KEY] = {"iter": st.iter, "compressed_step": st.compressed_step,
                       "u": {index[k]: t.clone() for k, t in st._u.items()},
                       "v": {index[k]: t.clone() for k, t in st._v.items()}}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        extra = state.pop(_KEY, None)
        super().load_state_dict(state)
        self.inner.state = self.state  # torch's load built a new state dict: share it again
        if extra is not None:
            st, params = self.dgc_state, self._params()
            st.iter, st.compressed_step = int(extra["iter"]), bool(extra["compressed_step"])
            st._u = {id(params[int(i)]): t.clone() for i, t in extra["u"].items()}
            st._v = {id(params[int(i)]): t.clone() for i, t in extra["v"].items()}

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        if not self.attached:
            raise RuntimeError("strategy.dgc needs the data-parallel model: wrap it with fleet.distributed_model "
                               "(the DGC comm hook goes on it)")
        if closure is not None:
            raise ValueError("strategy.dgc: step(closure) is not supported; call backward, then step()")
        if not self.dgc_state.compressed_step:
            return self.inner.step()
        st = self.dgc_state
        for group in self.param_groups:
            lr, mu, wd = float(group["lr"]), float(group["momentum"]), float(group.get("weight_decay", 0.0))
            for p in group["params"]:
                if p.grad is None:
                    continue
                if st.compresses(p):  # momentum (and decay) already in the gradient
                    p.add_(p.grad, alpha=-lr)
                    continue
                d_p = p.grad if not wd else p.grad.add(p, alpha=wd)
                buf = self.inner.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.inner.state[p]["momentum_buffer"] = d_p.clone()
                else:
                    buf.mul_(mu).add_(d_p)
                p.add_(buf, alpha=-lr)
        return None
