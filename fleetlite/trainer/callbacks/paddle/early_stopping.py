"""Paddle's ``EarlyStopping``: stops ``fit`` when a value of the evaluation logs stopped improving. Public as
``fleetlite.callbacks.EarlyStopping``."""

from __future__ import annotations

import os
import warnings
from typing import Any

from ...hapi_io import PaddleFiles
from ..base import Callback, is_rank_zero
from ..monitor import MonitorMixin, monitor_value, resolve_mode
from .during_fit import DuringFit
from .hints import evaluation_hint

__all__ = ["EarlyStopping"]


class EarlyStopping(DuringFit, MonitorMixin, Callback):
    """Paddle's ``EarlyStopping(monitor='loss', mode='auto', patience=0, verbose=1, min_delta=0, baseline=None,
    save_best_model=True)``.

    Acts after each evaluation of ``fit`` (``on_eval_end``) on the evaluation logs (``'loss'``, metric names),
    whichever face runs it, with Paddle's rule: ``mode='auto'`` is ``'max'`` when ``'acc'`` is in the name; an
    evaluation improves when it beats the best by more than ``min_delta`` (the shared rule of
    :class:`~fleetlite.trainer.callbacks.monitor.MonitorMixin`); ``wait`` resets on improvement and training
    stops when ``wait >= patience`` (so ``patience=0`` stops after the first evaluation). With
    ``save_best_model`` and ``fit(save_dir=...)`` (``fleetlite.Model``) each improvement writes
    ``{save_dir}/best_model`` (Paddle's ``Model.save`` files). No evaluation data: it never acts. For Keras'
    rule on the epoch logs (``val_loss``, ``restore_best_weights``) use
    :class:`fleetlite.trainer.callbacks.EarlyStopping`.

    Example::

        stop = EarlyStopping('loss', mode='min', patience=1, verbose=1, min_delta=0, baseline=None)
        model.fit(train_set, val_set, batch_size=64, epochs=20, save_dir="ckpt", callbacks=[stop])
    """

    def __init__(self, monitor: str = "loss", mode: str = "auto", patience: int = 0, verbose: int = 1,
                 min_delta: float = 0, baseline: float | None = None, save_best_model: bool = True) -> None:
        super().__init__()
        self.monitor = monitor
        self.patience = patience
        self.verbose = verbose
        self.baseline = baseline
        self.min_delta = abs(min_delta)
        self.wait_epoch = 0
        self.best_weights = None
        self.stopped_epoch = 0
        self.save_best_model = save_best_model
        self.save_dir: str | None = None  # set by fleetlite.Model.fit (Paddle's config_callbacks)
        if mode not in ("auto", "min", "max"):
            warnings.warn(f"EarlyStopping mode {mode} is unknown, fallback to auto mode.", stacklevel=2)
            mode = "auto"
        self._greater = resolve_mode(mode, monitor, rule="paddle") == "max"
        self.best_value = self._worst(self._mode())

    def _mode(self) -> str:
        return "max" if self._greater else "min"

    def on_train_begin(self, logs=None):
        self._start_training()
        self.wait_epoch = 0
        if self.baseline is not None:
            self.best_value = self.baseline
        else:
            self.best_value = self._worst(self._mode())
            self.best_weights = None

    def on_eval_end(self, logs=None):
        if not self._training:  # a standalone evaluate() is not an epoch of fit
            return
        if logs is None or self.monitor not in logs:
            hint = evaluation_hint(self.monitor, logs)
            warnings.warn(f"Monitor of EarlyStopping should be loss or metric name.{hint}", stacklevel=2)
            return
        current = monitor_value(logs, self.monitor)
        if current is None:
            return
        if self._improves(current, self.best_value, self._mode()):
            self.best_value = current
            self.wait_epoch = 0
            if self.save_best_model and self.save_dir is not None:
                PaddleFiles(self.trainer).save(os.path.join(self.save_dir, "best_model"))  # collective
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

    def state_dict(self) -> dict[str, Any]:
        return {"wait_epoch": self.wait_epoch, "stopped_epoch": self.stopped_epoch, "best_value": self.best_value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.wait_epoch, self.stopped_epoch = state["wait_epoch"], state["stopped_epoch"]
        self.best_value = state["best_value"]
