"""``build_callbacks``: the callback list of one ``fit``/``evaluate``/``predict`` call (the Trainer's defaults added).

Used by the Trainer; not exported by :mod:`fleetlite.callbacks` (it holds callbacks only).
"""

from __future__ import annotations

from .base import Callback
from .callback_list import CallbackList
from .history import History
from .lr_monitor import LearningRateMonitor
from .model_checkpoint import ModelCheckpoint
from .progress import ProgressBar

__all__ = ["build_callbacks"]


def build_callbacks(trainer, callbacks, verbose: int, log_freq: int, epochs: int, train, batch_size: int,
                    history: bool = True) -> CallbackList:
    """The callbacks of one fit/evaluate/predict call: the user's, plus History, a ProgressBar (unless
    ``verbose=0`` or one is given) and, with ``fit(save_dir=...)``, an epoch ModelCheckpoint."""
    given = list(callbacks or [])
    for cb in given:
        if not isinstance(cb, Callback):
            raise TypeError(f"callbacks must be fleetlite.callbacks.Callback instances, got {type(cb).__name__}")
    extra: list[Callback] = []
    if history and not any(isinstance(cb, History) for cb in given):
        extra.append(History())
    if verbose and not any(isinstance(cb, ProgressBar) for cb in given):
        extra.append(ProgressBar(log_freq=log_freq, verbose=verbose))
    if history and trainer.save_dir is not None and not any(isinstance(cb, ModelCheckpoint) for cb in given):
        given.append(ModelCheckpoint(save_dir=str(trainer.save_dir)))
    steps = train.length() if train is not None else None
    params = {"epochs": epochs, "steps": steps, "verbose": verbose, "log_freq": log_freq, "batch_size": batch_size,
              "world_size": trainer.world_size}
    first = [cb for cb in given if isinstance(cb, LearningRateMonitor)]  # its lr feeds every logger and History
    rest = [cb for cb in given if not isinstance(cb, LearningRateMonitor)]
    return CallbackList(first + extra + rest, trainer=trainer, params=params)
