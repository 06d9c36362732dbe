"""``EarlyStopping`` (Keras 3 semantics), public through :mod:`fleetlite.callbacks`."""

from __future__ import annotations

import math
import warnings
from typing import Any

from ..utils.user_warning import warn_user
from .callback_base import Callback, is_rank_zero

__all__ = ["EarlyStopping", "resolve_mode", "missing_monitor"]


def resolve_mode(mode: str, monitor: str) -> str:
    """``"min"``/``"max"``; ``"auto"`` is ``"max"`` for accuracy-like names, else ``"min"``."""
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"mode={mode!r} is not one of 'auto', 'min', 'max'")
    if mode != "auto":
        return mode
    name = monitor.lower()
    return "max" if any(s in name for s in ("acc", "auc", "precision", "recall", "f1")) else "min"


def missing_monitor(monitor: str, logs: dict[str, Any] | None, params: dict[str, Any] | None = None) -> bool:
    """True when ``monitor`` is not in epoch ``logs`` although it should be; an epoch that was simply not
    evaluated (``params["eval_freq"]`` set, no ``val_*`` value in its logs) does not count."""
    logs = logs or {}
    if monitor in logs:
        return False
    evaluated = any(k.startswith("val_") for k in logs)
    return not (monitor.startswith("val_") and not evaluated and (params or {}).get("eval_freq"))


class EarlyStopping(Callback):
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
        self.best = math.inf if self.mode == "min" else -math.inf
        self.best_epoch = 0
        self.best_weights: dict[str, Any] | None = None

    def _improves(self, value: float, reference: float) -> bool:
        if self.mode == "min":
            return value < reference - self.min_delta
        return value > reference + self.min_delta

    def on_train_begin(self, logs=None):
        if getattr(self.trainer, "_paddle_hapi", False):
            from .hapi_callbacks import paddle_early_stopping_begin

            return paddle_early_stopping_begin(self)
        self._reset()

    def on_eval_end(self, logs=None):
        if getattr(self.trainer, "_paddle_hapi", False) and getattr(self.trainer, "fitting", False):
            from .hapi_callbacks import paddle_early_stopping_eval_end

            paddle_early_stopping_eval_end(self, logs)

    def on_epoch_end(self, epoch, logs=None):
        if getattr(self.trainer, "_paddle_hapi", False):
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
        if self._improves(value, self.best):
            self.best = value
            self.best_epoch = epoch
            if self.restore_best_weights:
                self.best_weights = self.trainer.get_weights()
            if self.baseline is None or self._improves(value, self.baseline):
                self.wait = 0
        # unlike Keras 3, epochs that improve but stay short of the baseline count against patience (as documented)
        if self.wait > 0 and self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.trainer.stop_training = True

    def on_train_end(self, logs=None):
        if getattr(self.trainer, "_paddle_hapi", False):
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
