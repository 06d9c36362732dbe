"""``LearningRateScheduler``: Keras' per-epoch learning-rate schedule. Public through :mod:`fleetlite.callbacks`."""

from __future__ import annotations

import math
from collections.abc import Callable

from .base import Callback, is_rank_zero
from .lr_monitor import param_groups

__all__ = ["LearningRateScheduler"]


class LearningRateScheduler(Callback):
    """Keras' ``LearningRateScheduler(schedule, verbose=0)``: at each epoch start the learning rate becomes
    ``schedule(epoch, lr)`` (or ``schedule(epoch)``), on every parameter group.

    Example::

        trainer.fit(data, epochs=10, callbacks=[LearningRateScheduler(lambda e, lr: lr * 0.9 if e else lr)])
    """

    def __init__(self, schedule: Callable[..., float], verbose: int = 0) -> None:
        super().__init__()
        if not callable(schedule):
            raise TypeError("LearningRateScheduler needs a callable schedule(epoch, lr), got "
                            f"{type(schedule).__name__}")
        self.schedule = schedule
        self.verbose = verbose

    def on_epoch_begin(self, epoch, logs=None):
        groups = param_groups(getattr(self.trainer, "user_optimizer", None))
        lr = float(groups[0]["lr"])
        try:
            new = self.schedule(epoch, lr)
        except TypeError:
            new = self.schedule(epoch)
        if not isinstance(new, (int, float)) or isinstance(new, bool) or not math.isfinite(new):
            raise ValueError(f"LearningRateScheduler: schedule({epoch}, {lr}) returned {new!r}; it must return a "
                             "finite float")
        for g in groups:
            g["lr"] = float(new)
        if self.verbose and is_rank_zero():
            print(f"\nEpoch {epoch + 1}: LearningRateScheduler setting learning rate to {new}.")
