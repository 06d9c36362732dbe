"""Paddle's ``ReduceLROnPlateau``: lowers the learning rate after evaluations without improvement. Public as
``fleetlite.callbacks.ReduceLROnPlateau``."""

from __future__ import annotations

import warnings

from ..base import Callback
from ..reduce_lr_on_plateau import PlateauRule
from .during_fit import DuringFit
from .hints import evaluation_hint

__all__ = ["ReduceLROnPlateau"]


class ReduceLROnPlateau(DuringFit, PlateauRule, Callback):
    """Paddle's ``ReduceLROnPlateau(monitor='loss', factor=0.1, patience=10, verbose=1, mode='auto',
    min_delta=1e-4, cooldown=0, min_lr=0)``: multiply the learning rate by ``factor`` after ``patience``
    evaluations without improvement.

    Acts after each evaluation of ``fit`` (``on_eval_end``) on the evaluation logs (``'loss'``, ``'acc'``),
    whichever face runs it; ``mode='auto'``: ``'max'`` when ``'acc'`` is in the name. Every rank sees the same
    (reduced) value, so every rank changes its learning rate identically. For Keras' version on the epoch logs
    (``monitor='val_loss'``) use :class:`fleetlite.trainer.callbacks.ReduceLROnPlateau`.

    Example::

        model.fit(train_set, val_set, batch_size=64, epochs=20, callbacks=[ReduceLROnPlateau(patience=3)])
    """

    def __init__(self, monitor: str = "loss", factor: float = 0.1, patience: int = 10, verbose: int = 1,
                 mode: str = "auto", min_delta: float = 1e-4, cooldown: int = 0, min_lr: float = 0) -> None:
        super().__init__()
        self._configure(monitor, factor, patience, verbose, mode, min_delta, cooldown, min_lr)

    def on_train_begin(self, logs=None):
        self._start_training()
        self._reset()

    def on_eval_end(self, logs=None):
        if not self._training:  # a standalone evaluate() is not an epoch of fit
            return
        if logs is None or self.monitor not in logs:
            hint = evaluation_hint(self.monitor, logs)
            warnings.warn(f"Monitor of ReduceLROnPlateau should be loss or metric name.{hint}", stacklevel=2)
            return
        self._observe(logs)
