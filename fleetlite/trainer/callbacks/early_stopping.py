"""``EarlyStopping``: Keras 3 semantics (Paddle's under ``fleetlite.Model``); public in :mod:`fleetlite.callbacks`."""

from __future__ import annotations

import os
import warnings
from typing import Any

from ...utils.user_warning import warn_user
from .base import Callback, is_rank_zero
from .monitor import MonitorMixin, missing_monitor, monitor_value, resolve_mode

__all__ = ["EarlyStopping"]


class EarlyStopping(MonitorMixin, Callback):
    """Stop training when ``monitor`` has stopped improving (Paddle's signature and, under ``fleetlite.Model``,
    Paddle's behaviour).

    Positional order is Paddle's: ``(monitor, mode, patience, verbose, min_delta, baseline, save_best_model)``;
    ``restore_best_weights`` and ``start_from_epoch`` (Keras) are keyword-only. ``monitor=None`` means the
    evaluation loss: ``'loss'`` of the evaluation logs under ``fleetlite.Model`` (Paddle's default),
    ``'val_loss'`` of the epoch logs under ``fleetlite.Trainer``.

    Under ``fleetlite.Model`` (Paddle): acts after each evaluation of ``fit`` on the evaluation logs, with
    Paddle's rule (``wait`` resets on improvement, training stops when ``wait >= patience``, so
    ``patience=0`` stops after the first evaluation) and, with ``save_best_model`` and ``fit(save_dir=...)``,
    saves ``{save_dir}/best_model`` (Paddle's ``Model.save`` files) at each improvement.

    Under ``fleetlite.Trainer`` (Keras):

    An epoch improves when the value beats the best so far by more than
    ``min_delta`` (in the direction of ``mode``); after ``patience`` epochs
    without improvement (with ``baseline``: without beating the baseline too)
    the Trainer stops at the end of the epoch. ``restore_best_weights`` puts the
    best epoch's weights back when training ends. State (best value, wait,
    best weights) is checkpointed.

    Example::

        stop = EarlyStopping(monitor="val_acc", mode="max", patience=3, min_delta=1e-3)
        trainer.fit(data, eval_data=val, epochs=100, callbacks=[stop])
        print(stop.stopped_epoch, stop.best)
    """

    def __init__(self, monitor: str | None = None, mode: str = "auto", patience: int = 0, verbose: int = 1,
                 min_delta: float = 0.0, baseline: float | None = None, save_best_model: bool = True, *,
                 restore_best_weights: bool = False, start_from_epoch: int = 0) -> None:
        super().__init__()
        if patience < 0:
            raise ValueError(f"EarlyStopping(patience={patience}) must be >= 0")
        self._monitor_given = monitor
        monitor = "val_loss" if monitor is None else monitor
        self.monitor = monitor
        self.save_best_model = save_best_model
        self.save_dir: str | None = None  # set by fleetlite.Model.fit (Paddle's config_callbacks)
        if mode not in ("auto", "min", "max"):
            warnings.warn(f"EarlyStopping mode {mode} is unknown, fallback to auto mode.", stacklevel=2)
            mode = "auto"
        self._mode_arg = mode
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
        if getattr(self.trainer, "paddle_hapi", False):
            return self._paddle_begin()
        self._reset()

    def on_eval_end(self, logs=None):
        if getattr(self.trainer, "paddle_hapi", False) and getattr(self.trainer, "fitting", False):
            self._paddle_eval_end(logs)

    def on_epoch_end(self, epoch, logs=None):
        if getattr(self.trainer, "paddle_hapi", False):
            return
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
        if getattr(self.trainer, "paddle_hapi", False):
            return
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

    # -- Paddle's rule (under fleetlite.Model): acts after each evaluation of fit ------------------------------
    def _paddle_begin(self) -> None:
        self.monitor = "loss" if self._monitor_given is None else self._monitor_given
        self._greater = resolve_mode(self._mode_arg, self.monitor, rule="paddle") == "max"
        self.wait_epoch = 0
        self.stopped_epoch = 0
        if self.baseline is not None:
            self.best_value = self.baseline
        else:
            self.best_value = self._worst("max" if self._greater else "min")
            self.best_weights = None

    def _paddle_eval_end(self, logs) -> None:
        """Paddle's ``EarlyStopping.on_eval_end``, rule for rule."""
        if logs is None or self.monitor not in logs:
            warnings.warn("Monitor of EarlyStopping should be loss or metric name.", stacklevel=3)
            return
        current = monitor_value(logs, self.monitor)
        if current is None:
            return
        if self._improves(current, self.best_value, "max" if self._greater else "min"):
            self.best_value = current
            self.wait_epoch = 0
            if self.save_best_model and self.save_dir is not None:
                self.trainer.save(os.path.join(self.save_dir, "best_model"))
        else:
            self.wait_epoch += 1
        if self.wait_epoch >= self.patience:
            self.trainer.stop_training = True
            if self.verbose > 0 and is_rank_zero():
                print(f"Epoch {self.stopped_epoch + 1}: Early stopping.")
                if self.save_best_model and self.save_dir is not None:
                    best = os.path.abspath(os.path.join(self.save_dir, "best_model"))
                    print(f"Best checkpoint has been saved at {best}")
        self.stopped_epoch += 1
