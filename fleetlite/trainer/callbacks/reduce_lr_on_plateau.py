"""``ReduceLROnPlateau``: Paddle's and Keras' learning-rate reduction on a plateau of a monitored value.

Public through :mod:`fleetlite.callbacks`. Under ``fleetlite.Model`` the monitored value is read from the
evaluation logs (Paddle); under ``fleetlite.Trainer`` from the epoch logs (``val_*`` keys, Keras).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .base import Callback, is_rank_zero
from .lr_monitor import param_groups
from .monitor import MonitorMixin, monitor_value, resolve_mode

__all__ = ["ReduceLROnPlateau"]


class ReduceLROnPlateau(MonitorMixin, Callback):
    """Multiply the learning rate by ``factor`` when ``monitor`` stopped improving for ``patience`` evaluations
    (Paddle's and Keras' ``ReduceLROnPlateau``, Paddle's defaults).

    Under ``fleetlite.Model`` it acts after each evaluation in ``fit`` on the evaluation logs (``'loss'``,
    ``'acc'``; Paddle); under ``fleetlite.Trainer`` at each epoch end on the epoch logs (use e.g.
    ``monitor='val_loss'``). ``mode='auto'``: ``'max'`` when ``'acc'`` is in the name. Every rank sees the same
    (reduced) value, so every rank changes its learning rate identically.

    Example::

        model.fit(train_set, val_set, batch_size=64, epochs=20, callbacks=[ReduceLROnPlateau(patience=3)])
    """

    def __init__(self, monitor: str = "loss", factor: float = 0.1, patience: int = 10, verbose: int = 1,
                 mode: str = "auto", min_delta: float = 1e-4, cooldown: int = 0, min_lr: float = 0) -> None:
        super().__init__()
        if factor >= 1.0:
            raise ValueError("ReduceLROnPlateau does not support a factor >= 1.0.")
        if mode not in ("auto", "min", "max"):
            warnings.warn(f"Learning rate reduction mode {mode} is unknown, fallback to auto mode.", stacklevel=2)
            mode = "auto"
        self.monitor, self.factor, self.patience, self.verbose = monitor, factor, patience, verbose
        self.mode, self.min_delta, self.cooldown, self.min_lr = mode, min_delta, cooldown, min_lr
        self.epoch = 0
        self._reset()

    def _reset(self) -> None:
        self._greater = resolve_mode(self.mode, self.monitor, rule="paddle") == "max"
        self.best = self._worst("max" if self._greater else "min")
        self.cooldown_counter = 0
        self.wait = 0

    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def on_train_begin(self, logs=None):
        self._reset()

    def on_eval_end(self, logs=None):
        if getattr(self.trainer, "paddle_hapi", False) and getattr(self.trainer, "fitting", False):
            self._observe(logs)

    def on_epoch_end(self, epoch, logs=None):
        if not getattr(self.trainer, "paddle_hapi", False):
            self._observe(logs)

    def _observe(self, logs) -> None:
        current = monitor_value(logs, self.monitor)
        if current is None:
            warnings.warn(f"Monitor of ReduceLROnPlateau should be loss or metric name; {self.monitor!r} is not "
                          f"in the logs (available: {sorted(logs or {})})", stacklevel=3)
            return
        if self.in_cooldown():
            self.cooldown_counter -= 1
            self.wait = 0
        if self._improves(current, self.best, "max" if self._greater else "min"):
            self.best, self.wait = current, 0
        elif not self.in_cooldown():
            self.wait += 1
            if self.wait >= self.patience:
                groups = param_groups(self.trainer)
                reduced = False
                for g in groups:
                    if float(g["lr"]) > float(torch.tensor(self.min_lr, dtype=torch.float32)):
                        g["lr"] = max(float(g["lr"]) * self.factor, self.min_lr)
                        reduced = True
                if reduced:
                    if self.verbose > 0 and is_rank_zero():
                        print(f"\nEpoch {self.epoch + 1}: ReduceLROnPlateau reducing learning rate to "
                              f"{groups[0]['lr']}.")
                    self.cooldown_counter = self.cooldown
                    self.wait = 0
        self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "cooldown_counter": self.cooldown_counter, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.wait = state["best"], state["wait"]
        self.cooldown_counter, self.epoch = state["cooldown_counter"], state["epoch"]
