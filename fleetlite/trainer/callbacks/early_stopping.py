"""``EarlyStopping``: Keras 3's rule on the epoch logs. Public through :mod:`fleetlite.trainer.callbacks`;
Paddle's (after each evaluation, on the evaluation logs) is :class:`fleetlite.callbacks.EarlyStopping`."""

from __future__ import annotations

from typing import Any

from ...utils.user_warning import warn_user
from .base import Callback, is_rank_zero
from .monitor import MonitorMixin, missing_monitor, resolve_mode

__all__ = ["EarlyStopping"]


class EarlyStopping(MonitorMixin, Callback):
    """Keras' ``EarlyStopping(monitor='val_loss', min_delta=0, patience=0, verbose=0, mode='auto', baseline=None,
    restore_best_weights=False, start_from_epoch=0)``: stop training when ``monitor`` (a key of the epoch logs)
    has stopped improving.

    An epoch improves when the value beats the best so far by more than
    ``min_delta`` (in the direction of ``mode``); after ``patience`` epochs
    without improvement (with ``baseline``: without beating the baseline too)
    the Trainer stops at the end of the epoch. ``restore_best_weights`` puts the
    best epoch's weights back when training ends. State (best value, wait,
    best weights) is checkpointed. Works under either face; Paddle's version is
    :class:`fleetlite.callbacks.EarlyStopping`.

    Example::

        stop = EarlyStopping(monitor="val_acc", mode="max", patience=3, min_delta=1e-3)
        trainer.fit(data, eval_data=val, epochs=100, callbacks=[stop])
        print(stop.stopped_epoch, stop.best)
    """

    def __init__(self, monitor: str = "val_loss", min_delta: float = 0.0, patience: int = 0, verbose: int = 0,
                 mode: str = "auto", baseline: float | None = None, restore_best_weights: bool = False,
                 start_from_epoch: int = 0) -> None:
        super().__init__()
        if patience < 0:
            raise ValueError(f"EarlyStopping(patience={patience}) must be >= 0")
        self.monitor = monitor
        self.mode = resolve_mode(mode, monitor)
        self.patience = int(patience)
        self.min_delta = abs(float(min_delta))
        self.baseline = baseline
        self.restore_best_weights = restore_best_weights
        self.verbose = verbose
        self.start_from_epoch = start_from_epoch
        self._reset()
        self._warned = False

    def _reset(self) -> None:
        self.wait = 0
        self.stopped_epoch = 0
        self.best = self._worst(self.mode)
        self.best_epoch = 0
        self.best_weights: dict[str, Any] | None = None

    def on_train_begin(self, logs=None):
        self._reset()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.monitor not in logs:
            if not self._warned and missing_monitor(self.monitor, logs, self.params):
                warn_user(f"EarlyStopping: monitor {self.monitor!r} is not in the epoch logs (available: "
                          f"{sorted(logs)}); pass one of those, or eval_data to fit for val_* values")
                self._warned = True
            return
        if epoch < self.start_from_epoch:
            return
        value = float(logs[self.monitor])
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights = self.trainer.get_weights()
        self.wait += 1
        if self._improves(value, self.best, self.mode):
            self.best = value
            self.best_epoch = epoch
            if self.restore_best_weights:
                self.best_weights = self.trainer.get_weights()
            if self.baseline is None or self._improves(value, self.baseline, self.mode):
                self.wait = 0
        # unlike Keras 3, epochs that improve but stay short of the baseline count against patience (as documented)
        if self.wait > 0 and self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.trainer.stop_training = True

    def on_train_end(self, logs=None):
        if self.stopped_epoch > 0 and self.verbose and is_rank_zero():
            print(f"Epoch {self.stopped_epoch}: early stopping ({self.monitor} did not improve on "
                  f"{self.best:.6g} for {self.wait} epochs)")
        if self.restore_best_weights and self.best_weights is not None:
            if self.verbose and is_rank_zero():
                print(f"Restoring the weights of the best epoch ({self.best_epoch})")
            self.trainer.set_weights(self.best_weights)

    def state_dict(self) -> dict[str, Any]:
        return {"wait": self.wait, "stopped_epoch": self.stopped_epoch, "best": self.best,
                "best_epoch": self.best_epoch, "best_weights": self.best_weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.wait = state["wait"]
        self.stopped_epoch = state["stopped_epoch"]
        self.best = state["best"]
        self.best_epoch = state["best_epoch"]
        self.best_weights = state["best_weights"]
