"""``CallbackList``: dispatches each hook to every callback, in order, and keys their states for checkpoints.

Public through :mod:`fleetlite.callbacks`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...utils.user_warning import warn_user
from .base import Callback
from .history import History
from .lr_monitor import LearningRateMonitor
from .model_checkpoint import ModelCheckpoint
from .progress import ProgressBar

__all__ = ["CallbackList"]


class CallbackList:
    """Dispatches each hook to every callback, in order; keys their states for checkpoints.

    Example::

        cbs = CallbackList([History()], trainer=trainer, params={"epochs": 1})
        cbs.on_epoch_end(0, {"loss": 0.5})
    """

    def __init__(self, callbacks: Iterable[Callback] | None = None, trainer=None,
                 params: dict[str, Any] | None = None) -> None:
        self.callbacks: list[Callback] = []
        for cb in callbacks or ():
            self.append(cb)
        self.trainer = trainer
        self.params = dict(params or {})
        if trainer is not None:
            self.set_model(trainer)
        self.set_params(self.params)

    @classmethod
    def for_call(cls, callbacks: Iterable[Callback] | None, trainer, *, verbose: int, log_freq: int, epochs: int,
                 train=None, batch_size: int, history: bool = True) -> CallbackList:
        """The callbacks of one fit/evaluate/predict call (Keras' ``CallbackList(add_history=, add_progbar=)``):
        the user's, plus History, a ProgressBar (unless ``verbose=0`` or one is given) and, when the Trainer has
        a ``save_dir`` (``fit(save_dir=...)``), an epoch ModelCheckpoint; a LearningRateMonitor goes first, so
        its rate feeds every logger and History."""
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
        params = {"epochs": epochs, "steps": train.length() if train is not None else None, "verbose": verbose,
                  "log_freq": log_freq, "batch_size": batch_size, "world_size": trainer.world_size}
        first = [cb for cb in given if isinstance(cb, LearningRateMonitor)]
        rest = [cb for cb in given if not isinstance(cb, LearningRateMonitor)]
        return cls(first + extra + rest, trainer=trainer, params=params)

    def append(self, callback: Callback) -> None:
        if not isinstance(callback, Callback):
            raise TypeError(f"callbacks must be fleetlite.callbacks.Callback instances, got "
                            f"{type(callback).__name__}; subclass Callback and override its hooks")
        self.callbacks.append(callback)

    def set_model(self, trainer) -> None:
        self.trainer = trainer
        for cb in self.callbacks:
            cb.set_model(trainer)

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params
        for cb in self.callbacks:
            cb.set_params(params)

    def find(self, cls: type) -> list[Callback]:
        return [cb for cb in self.callbacks if isinstance(cb, cls)]

    def __iter__(self):
        return iter(self.callbacks)

    def __len__(self) -> int:
        return len(self.callbacks)

    def keys(self) -> list[str]:
        seen: dict[str, int] = {}
        out = []
        for cb in self.callbacks:
            name = type(cb).__name__
            n = seen.get(name, 0)
            seen[name] = n + 1
            out.append(name if n == 0 else f"{name}#{n}")
        return out

    def state_dict(self) -> dict[str, Any]:
        return {k: cb.state_dict() for k, cb in zip(self.keys(), self.callbacks)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        keys = self.keys()
        for k, cb in zip(keys, self.callbacks):
            if k in state:
                cb.load_state_dict(state[k])
            elif cb.state_dict():
                warn_user(f"fleetlite: the checkpoint has no state for callback {k}; it starts fresh")
        extra = sorted(k for k in set(state) - set(keys) if state[k])
        if extra:
            warn_user(f"fleetlite: the checkpoint holds state for callbacks not passed to fit: {extra}; "
                          "ignored")

    def _call(self, hook: str, *args) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(*args)

    # -- the hooks, each dispatched to every callback in order ------------------------------------------------
    def on_train_begin(self, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_train_begin(logs)

    def on_train_end(self, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_train_end(logs)

    def on_exception(self, error: BaseException) -> None:
        for cb in self.callbacks:  # e.g. trackers mark their run FAILED
            cb.on_exception(error)

    def on_epoch_begin(self, epoch, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_epoch_end(epoch, logs)

    def on_train_batch_begin(self, step, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_train_batch_begin(step, logs)

    def on_train_batch_end(self, step, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_train_batch_end(step, logs)

    def on_eval_begin(self, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_eval_begin(logs)

    def on_eval_end(self, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_eval_end(logs)

    def on_eval_batch_begin(self, step, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_eval_batch_begin(step, logs)

    def on_eval_batch_end(self, step, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_eval_batch_end(step, logs)

    def on_predict_begin(self, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_predict_begin(logs)

    def on_predict_end(self, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_predict_end(logs)

    def on_predict_batch_begin(self, step, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_predict_batch_begin(step, logs)

    def on_predict_batch_end(self, step, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_predict_batch_end(step, logs)
