"""Callbacks under Paddle's and Keras' names: ``ProgBarLogger``, ``VisualDL``, ``ReduceLROnPlateau`` (Paddle) and
``LearningRateScheduler``, ``TerminateOnNaN``, ``LambdaCallback``, ``BackupAndRestore`` (Keras).

Public through :mod:`fleetlite.callbacks`. Under ``fleetlite.Model`` the monitored values are read from the
evaluation logs (Paddle); under ``fleetlite.Trainer`` from the epoch logs (``val_*`` keys, Keras).
"""

from __future__ import annotations

import math
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .callback_base import Callback, is_rank_zero
from .model_checkpoint import ModelCheckpoint
from .progress import ProgressBar

__all__ = ["ProgBarLogger", "VisualDL", "ReduceLROnPlateau", "LearningRateScheduler",
           "LambdaCallback", "BackupAndRestore"]


def _param_groups(trainer) -> list[dict[str, Any]]:
    opt = getattr(trainer, "user_optimizer", None)
    if opt is None:
        raise ValueError("this callback changes the learning rate, but the model has no optimizer; give one to "
                         "prepare()/compile() first")
    return opt.param_groups


class ProgBarLogger(ProgressBar):
    """Paddle's ``ProgBarLogger(log_freq=1, verbose=2)``: the progress display under Paddle's name and defaults.

    Example::

        model.fit(train_set, batch_size=64, callbacks=ProgBarLogger(log_freq=10))
    """

    def __init__(self, log_freq: int = 1, verbose: int = 2) -> None:
        super().__init__(log_freq=log_freq, verbose=verbose)


class VisualDL(Callback):
    """Paddle's ``VisualDL(log_dir)``, written as TensorBoard event files (rank 0).

    Tags as Paddle's: ``train/<name>`` per training batch (step = batches so far), ``eval/<name>`` per
    evaluation (step = epoch). Needs the ``tensorboard`` package.

    Example::

        model.fit(train_set, val_set, batch_size=64, callbacks=VisualDL(log_dir="visualdl_log_dir"))
    """

    def __init__(self, log_dir: str) -> None:
        super().__init__()
        from .callbacks import _summary_writer_class

        self._writer_cls = _summary_writer_class()
        self.log_dir = log_dir
        self.writer = None
        self.train_step = 0
        self.epoch = 0

    def _write(self, logs, mode: str, step: int) -> None:
        if not is_rank_zero():
            return
        if self.writer is None:
            self.writer = self._writer_cls(log_dir=self.log_dir)
        for k, v in (logs or {}).items():
            if k in ("batch_size", "step", "steps", "metrics"):
                continue
            if isinstance(v, (list, tuple)):
                v = v[0] if v else None
            if isinstance(v, torch.Tensor) and v.numel() == 1:
                v = v.item()
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(f"{mode}/{k}", v, step)

    def on_train_begin(self, logs=None):
        self.train_step = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, step, logs=None):
        self.train_step += 1
        self._write(logs, "train", self.train_step)

    def on_eval_end(self, logs=None):
        self._write(logs, "eval", self.epoch)
        if self.writer is not None:
            self.writer.flush()

    def on_train_end(self, logs=None):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class ReduceLROnPlateau(Callback):
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
        self._greater = self.mode == "max" or (self.mode == "auto" and "acc" in self.monitor)
        self.best = -math.inf if self._greater else math.inf
        self.cooldown_counter = 0
        self.wait = 0

    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def on_train_begin(self, logs=None):
        self._reset()

    def on_eval_end(self, logs=None):
        if getattr(self.trainer, "_paddle_hapi", False) and getattr(self.trainer, "fitting", False):
            self._observe(logs)

    def on_epoch_end(self, epoch, logs=None):
        if not getattr(self.trainer, "_paddle_hapi", False):
            self._observe(logs)

    def _observe(self, logs) -> None:
        from .hapi_callbacks import monitor_value

        current = monitor_value(logs, self.monitor)
        if current is None:
            warnings.warn(f"Monitor of ReduceLROnPlateau should be loss or metric name; {self.monitor!r} is not "
                          f"in the logs (available: {sorted(logs or {})})", stacklevel=3)
            return
        if self.in_cooldown():
            self.cooldown_counter -= 1
            self.wait = 0
        better = (current > self.best + self.min_delta) if self._greater else (current < self.best - self.min_delta)
        if better:
            self.best, self.wait = current, 0
        elif not self.in_cooldown():
            self.wait += 1
            if self.wait >= self.patience:
                groups = _param_groups(self.trainer)
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
        groups = _param_groups(self.trainer)
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


class LambdaCallback(Callback):
    """Keras' ``LambdaCallback``: a callback from plain functions, e.g. ``on_epoch_end=lambda epoch, logs: ...``.

    Any hook name of :class:`Callback` is accepted; Keras' ``on_batch_begin``/``on_batch_end`` mean the
    training batch hooks.

    Example::

        trainer.fit(data, epochs=2, callbacks=[LambdaCallback(on_epoch_end=lambda e, logs: print(e, logs))])
    """

    def __init__(self, on_epoch_begin=None, on_epoch_end=None, on_batch_begin=None, on_batch_end=None,
                 on_train_begin=None, on_train_end=None, **kwargs: Callable[..., Any]) -> None:
        super().__init__()
        from .callback_base import HOOKS

        given = dict(on_epoch_begin=on_epoch_begin, on_epoch_end=on_epoch_end, on_train_batch_begin=on_batch_begin,
                     on_train_batch_end=on_batch_end, on_train_begin=on_train_begin, on_train_end=on_train_end)
        for name, fn in kwargs.items():
            if name not in HOOKS:
                raise TypeError(f"LambdaCallback: unknown hook {name!r}; hooks are {', '.join(HOOKS)}")
            given[name] = fn
        for name, fn in given.items():
            if fn is not None:
                setattr(self, name, fn)


class BackupAndRestore(ModelCheckpoint):
    """Keras' ``BackupAndRestore(backup_dir, save_freq='epoch', delete_checkpoint=True)``: checkpoint every
    epoch (or every ``save_freq`` steps) and resume from it automatically when ``fit`` runs again after an
    interruption (``fit(resume="auto")`` on ``backup_dir``); a run that ends normally deletes the backup.

    Example::

        trainer.fit(data, epochs=10, callbacks=[BackupAndRestore("/tmp/backup")])   # rerun after a crash
    """

    _auto_resume = True

    def __init__(self, backup_dir: str, save_freq: str | int = "epoch", delete_checkpoint: bool = True) -> None:
        if save_freq == "epoch":
            super().__init__(backup_dir, save_freq=1)
        elif isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0:
            super().__init__(backup_dir, save_freq=None, save_steps=save_freq)
        else:
            raise ValueError(f"BackupAndRestore(save_freq={save_freq!r}): 'epoch' or a positive number of steps")
        self.delete_checkpoint = delete_checkpoint

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        t = self.trainer
        finished = not getattr(t, "preempted", None) and getattr(t, "terminated_on_nan", None) is None
        if self.delete_checkpoint and finished and is_rank_zero() and self.directory is not None:
            shutil.rmtree(Path(self.directory), ignore_errors=True)
