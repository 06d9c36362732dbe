"""``EMA``: an exponential moving average of the weights, on ``torch.optim.swa_utils``.

The average is an ``AveragedModel`` of the *plain* network (``trainer.network``,
never the data-parallel wrapper, so no engine state is copied) updated with
``get_ema_multi_avg_fn(decay)`` after every optimizer step that really
stepped (an amp step skipped for overflow is not averaged). Every rank holds
the same weights after a step, so every rank's average is the same. Its
state (weights, buffers, ``n_averaged``) goes into checkpoints, so a resumed
run continues the average bit for bit.

Example::

    ema = EMA(decay=0.999, eval_with_ema=True)     # validation in fit uses the averaged weights
    trainer.fit(data, eval_data=val, epochs=5, callbacks=[ema])
    ema.copy_to(trainer.network)                   # keep the averaged weights
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from .base import Callback

__all__ = ["EMA"]


class EMA(Callback):
    """Keep an exponential moving average of the model's weights (see the module docstring).

    Args:
        decay: the EMA decay (``avg = decay * avg + (1 - decay) * weights``), in ``[0, 1)``.
        use_buffers: average the buffers too (BatchNorm statistics), as ``AveragedModel(use_buffers=True)``.
        eval_with_ema: evaluate inside ``fit`` with the averaged weights (the training weights are put back
            afterwards).

    Example::

        ema = EMA(0.99)
        trainer.fit(data, epochs=3, callbacks=[ema])
        trainer.evaluate(val, callbacks=[ema.evaluating()])   # one evaluation with the EMA weights
    """

    def __init__(self, decay: float = 0.999, use_buffers: bool = True, eval_with_ema: bool = False) -> None:
        super().__init__()
        if not 0.0 <= float(decay) < 1.0:
            raise ValueError(f"EMA(decay={decay!r}) must be in [0, 1)")
        self.decay = float(decay)
        self.use_buffers = use_buffers
        self.eval_with_ema = eval_with_ema
        self.averaged: Any = None
        self._saved: dict[str, torch.Tensor] | None = None
        self._pending_state: dict[str, Any] | None = None

    def _build(self) -> None:
        if self.averaged is None:
            self.averaged = AveragedModel(self.trainer.network, multi_avg_fn=get_ema_multi_avg_fn(self.decay),
                                          use_buffers=self.use_buffers)
        if self._pending_state is not None:
            self.averaged.load_state_dict(self._pending_state)
            self._pending_state = None

    def on_train_begin(self, logs=None):
        self._build()

    def on_train_batch_end(self, step, logs=None):
        t = self.trainer
        if t.at_step_boundary and getattr(t.optimizer, "stepped", True):
            self.averaged.update_parameters(t.network)

    # -- evaluation with the averaged weights ----------------------------------------------------------------
    def _swap_in(self) -> None:
        net = self.trainer.network
        self._saved = {k: v.detach().clone() for k, v in net.state_dict().items()}
        self.copy_to(net)

    def _swap_out(self) -> None:
        if self._saved is not None:
            with torch.no_grad():
                for k, v in self.trainer.network.state_dict().items():
                    v.copy_(self._saved[k])
            self._saved = None

    def on_eval_begin(self, logs=None):
        if self.eval_with_ema and self.averaged is not None:
            self._swap_in()

    def on_eval_end(self, logs=None):
        self._swap_out()

    def evaluating(self) -> EMA:
        """A copy of this callback that evaluates with the averaged weights (for ``trainer.evaluate``)."""
        view = EMA(self.decay, self.use_buffers, eval_with_ema=True)
        view.averaged = self.averaged
        return view

    def copy_to(self, module: nn.Module) -> None:
        """Copy the averaged weights (and buffers) into ``module`` in place."""
        if self.averaged is None:
            raise RuntimeError("EMA has no average yet: it starts when fit runs with this callback")
        src = self.averaged.module.state_dict()
        with torch.no_grad():
            for k, v in module.state_dict().items():
                v.copy_(src[k])

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.averaged is None:
            return {}
        return {"averaged": {k: v.detach().cpu().clone() for k, v in self.averaged.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "averaged" not in state:
            return
        if self.averaged is None:
            self._pending_state = state["averaged"]
        else:
            self.averaged.load_state_dict(state["averaged"])
