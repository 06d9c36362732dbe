"""``ReduceLROnPlateau`` (Keras') and the plateau rule it shares with Paddle's (:mod:`.paddle.reduce_lr_on_plateau`).

Public through :mod:`fleetlite.trainer.callbacks`. The two classes differ only in what they watch: Keras' the
epoch logs (``val_loss``) at each epoch end, Paddle's the evaluation logs (``loss``) after each evaluation.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .base import Callback, is_rank_zero
from .lr_monitor import param_groups
from .monitor import MonitorMixin, missing_monitor, monitor_value, resolve_mode

__all__ = ["ReduceLROnPlateau", "PlateauRule"]


class PlateauRule(MonitorMixin):
    """The rule Keras and Paddle share: after ``patience`` observations without improvement (by more than
    ``min_delta``; ``mode='auto'``: ``'max'`` when ``'acc'`` is in the name) multiply every group's learning rate
    by ``factor`` (not below ``min_lr``), then wait ``cooldown`` observations."""

    def _configure(self, monitor: str, factor: float, patience: int, verbose: int, mode: str, min_delta: float,
                   cooldown: int, min_lr: float) -> None:
        if factor >= 1.0:
            raise ValueError("ReduceLROnPlateau does not support a factor >= 1.0.")
        if mode not in ("auto", "min", "max"):
            warnings.warn(f"Learning rate reduction mode {mode} is unknown, fallback to auto mode.", stacklevel=3)
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

    def _observe(self, logs) -> None:
        current = monitor_value(logs, self.monitor)
        if current is None:
            return
        if self.in_cooldown():
            self.cooldown_counter -= 1
            self.wait = 0
        if self._improves(current, self.best, "max" if self._greater else "min"):
            self.best, self.wait = current, 0
        elif not self.in_cooldown():
            self.wait += 1
            if self.wait >= self.patience:
                groups = param_groups(getattr(self.trainer, "user_optimizer", None))
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


class ReduceLROnPlateau(PlateauRule, Callback):
    """Keras' ``ReduceLROnPlateau(monitor='val_loss', factor=0.1, patience=10, verbose=0, mode='auto',
    min_delta=1e-4, cooldown=0, min_lr=0.0)``: at each epoch end, on the epoch logs, multiply the learning rate
    by ``factor`` after ``patience`` epochs without improvement.

    Every rank sees the same (reduced) value, so every rank changes its learning rate identically. Paddle's
    version (after each evaluation, on the evaluation logs) is :class:`fleetlite.callbacks.ReduceLROnPlateau`.

    Example::

        trainer.fit(data, eval_data=val, epochs=20, callbacks=[ReduceLROnPlateau("val_loss", patience=3)])
    """

    def __init__(self, monitor: str = "val_loss", factor: float = 0.1, patience: int = 10, verbose: int = 0,
                 mode: str = "auto", min_delta: float = 1e-4, cooldown: int = 0, min_lr: float = 0.0) -> None:
        super().__init__()
        self._configure(monitor, factor, patience, verbose, mode, min_delta, cooldown, min_lr)
        self._warned = False

    def on_train_begin(self, logs=None):
        self._reset()

    def on_epoch_end(self, epoch, logs=None):
        if monitor_value(logs, self.monitor) is None:
            if not self._warned and missing_monitor(self.monitor, logs, self.params):
                warnings.warn(f"ReduceLROnPlateau: monitor {self.monitor!r} is not in the epoch logs (available: "
                              f"{sorted(logs or {})}); pass one of those, or eval_data to fit for val_* values",
                              stacklevel=2)
                self._warned = True
            return
        self._observe(logs)
