"""Callbacks: the hooks the Trainer fires, their dispatcher, and the built-ins.

Hooks and their arguments follow Keras (``on_train_batch_end(step, logs)``,
``on_epoch_end(epoch, logs)``, ...). ``callback.model`` (Paddle's name) and
``callback.trainer`` are the running :class:`~fleetlite.Trainer`;
``callback.params`` holds ``epochs``, ``steps``, ``verbose``, ``log_freq``...
Per-batch logs are rank-local running values (0-d tensors or floats, as in
Keras 3); epoch logs are exact values reduced over all ranks, plain floats.

Every callback has ``state_dict()``/``load_state_dict()`` so its state goes
into the checkpoint and a resumed run continues where it stopped.

Built-ins: :class:`History` (added by ``fit``), :class:`ProgressBar`,
:class:`ModelCheckpoint`, :class:`EarlyStopping`, :class:`Preemption`, :class:`LRScheduler`,
:class:`CSVLogger`, :class:`TensorBoard`, :class:`TerminateOnNaN`; trackers and tools in their own modules:
:class:`LearningRateMonitor`, :class:`MLflowLogger`, :class:`WandbCallback` (loggers.py),
:class:`Profiler` (profiler.py).

Example::

    import fleetlite

    class PrintLoss(fleetlite.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print(epoch, logs["loss"])

    trainer.fit(train_set, epochs=2, callbacks=[PrintLoss()])
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from ..utils.atomic import atomic_write_text
from .callback_base import Callback, CallbackList, History, is_rank_zero
from .early_stopping import EarlyStopping
from .loggers import LearningRateMonitor, MLflowLogger, WandbCallback
from .model_checkpoint import ModelCheckpoint
from .preemption import Preemption
from .profiler import Profiler
from .progress import ProgressBar
from .terminate_on_nan import NonFiniteLossError, TerminateOnNaN

__all__ = ["Callback", "CallbackList", "History", "ProgressBar", "ModelCheckpoint", "EarlyStopping",
           "Preemption", "LRScheduler", "CSVLogger", "TensorBoard", "TerminateOnNaN", "NonFiniteLossError",
           "atomic_write_text", "build_callbacks", "ProgBarLogger", "VisualDL", "ReduceLROnPlateau",
           "LearningRateScheduler", "LambdaCallback", "BackupAndRestore", "config_callbacks", "EMA",
           "LearningRateMonitor", "MLflowLogger", "WandbCallback", "Profiler"]


class LRScheduler(Callback):
    """Step a torch LR scheduler per epoch or per optimizer step (Paddle's ``LRScheduler(by_step, by_epoch)`` too).

    Two ways to call it:

    * Paddle: ``LRScheduler(by_step=True, by_epoch=False)`` (positional ``LRScheduler(False, True)`` too) steps
      the scheduler that drives the optimizer - the Trainer's ``lr_scheduler`` attribute, else
      ``optimizer.lr_scheduler``, else the live torch scheduler built on that optimizer. ``fleetlite.Model.fit``
      adds ``LRScheduler()`` (per step) unless one is given, as Paddle does.
    * Trainer: ``LRScheduler(scheduler, by_step=False)``: that scheduler, per epoch unless ``by_step=True``.

    Its state (the scheduler's ``state_dict``) is saved in checkpoints.
    ``monitor`` feeds an epoch log value to schedulers that need one
    (``ReduceLROnPlateau``).

    Example::

        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
        trainer.fit(data, epochs=30, callbacks=[LRScheduler(sched)])
        # per step, e.g. OneCycleLR:
        LRScheduler(torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=1000), by_step=True)
    """

    def __init__(self, scheduler: Any = None, by_step: bool | None = None, by_epoch: bool | None = None,
                 monitor: str | None = None) -> None:
        super().__init__()
        if isinstance(scheduler, bool):  # Paddle's positional order: LRScheduler(by_step, by_epoch)
            scheduler, by_step, by_epoch = None, scheduler, (by_step if by_epoch is None else by_epoch)
        self._find = scheduler is None
        if self._find:  # Paddle's defaults: by_step=True, by_epoch=False
            by_epoch = bool(by_epoch)
            by_step = (not by_epoch) if by_step is None else by_step
            if by_step and by_epoch:
                raise ValueError("by_step option is mutually exclusive with by_epoch")
        by_step = bool(by_step)
        if not self._find and (not hasattr(scheduler, "step") or not hasattr(scheduler, "state_dict")):
            raise TypeError(f"LRScheduler wraps a torch LR scheduler (with step() and state_dict()), got "
                            f"{type(scheduler).__name__}; e.g. LRScheduler(torch.optim.lr_scheduler.StepLR(opt, 10))")
        self.scheduler = scheduler
        self.by_step = bool(by_step)
        self.by_epoch = (not self.by_step) if by_epoch is None else bool(by_epoch)
        if self.by_step and self.by_epoch:
            raise ValueError("LRScheduler: choose by_step=True or by_epoch=True, not both")
        self.monitor = monitor

    def _step(self, logs):
        with warnings.catch_warnings():
            # a resumed run may reach an epoch end before its first optimizer step: the order is right, torch's
            # heuristic ("lr_scheduler.step() before optimizer.step()") does not know about resuming
            warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
            self._step_now(logs)

    def _step_now(self, logs):
        if self.monitor is None:
            self.scheduler.step()
            return
        if not logs or self.monitor not in logs:
            raise KeyError(f"LRScheduler(monitor={self.monitor!r}): no such value in the logs "
                           f"(available: {sorted(logs or {})}); pass eval_data to fit for val_* values")
        self.scheduler.step(float(logs[self.monitor]))

    def on_train_begin(self, logs=None):
        if self._find:
            from .hapi_callbacks import find_scheduler

            t = self.trainer
            self.scheduler = getattr(t, "lr_scheduler", None) or find_scheduler(
                getattr(t, "user_optimizer", None) or getattr(t, "_optimizer", None))

    def on_train_batch_end(self, step, logs=None):
        if self.scheduler is not None and self.by_step and getattr(self.trainer, "at_step_boundary", True):
            self._step(logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.scheduler is not None and self.by_epoch:
            self._step(logs)

    def state_dict(self) -> dict[str, Any]:
        return {} if self.scheduler is None else {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])


class CSVLogger(Callback):
    """One CSV row per epoch (epoch, then every epoch log value), rewritten atomically on rank 0.

    ``filename`` is relative to the run directory: ``fit(save_dir=...)`` when
    given, else the current directory (Hydra's run directory in recipes).

    Example::

        trainer.fit(data, eval_data=val, epochs=5, save_dir="runs/a", callbacks=[CSVLogger()])
        # runs/a/training.csv: epoch,acc,loss,val_acc,val_loss
    """

    def __init__(self, filename: str = "training.csv", separator: str = ",", append: bool = False) -> None:
        super().__init__()
        self.filename = filename
        self.separator = separator
        self.append = append
        self.rows: list[dict[str, Any]] = []
        self.path: Path | None = None

    def on_train_begin(self, logs=None):
        base = self.trainer.run_dir if self.trainer is not None else Path.cwd()
        self.path = Path(base) / self.filename
        if self.append and self.path.exists() and not self.rows:
            import csv

            with open(self.path, newline="", encoding="utf-8") as f:
                self.rows = [dict(r) for r in csv.DictReader(f, delimiter=self.separator)]
        elif not self.append:
            self.rows = []

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": epoch}
        row.update({k: _plain(v) for k, v in sorted((logs or {}).items())})
        self.rows.append(row)
        if is_rank_zero() and self.path is not None:
            keys: list[str] = []
            for r in self.rows:
                keys.extend(k for k in r if k not in keys)
            import csv
            import io

            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=keys, delimiter=self.separator, lineterminator="\n")
            writer.writeheader()
            writer.writerows(self.rows)
            atomic_write_text(self.path, buf.getvalue())

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [dict(r) for r in self.rows]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = [dict(r) for r in state["rows"]]


def _plain(v):
    if hasattr(v, "item"):
        return v.item()
    return v


def _summary_writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError("the TensorBoard callback needs the tensorboard package, which is not installed: "
                          "pip install tensorboard (or pip install 'fleetlite[tensorboard]'), or drop the "
                          f"TensorBoard callback ({e})") from None
    return SummaryWriter


class TensorBoard(Callback):
    """Write epoch logs (and every ``log_freq`` steps the running loss) as TensorBoard scalars on rank 0.

    The learning rate of each param group is written with the epoch logs (``epoch/lr``); with
    ``histogram_freq=N``, parameter and gradient histograms every N optimizer steps.

    Needs the ``tensorboard`` package; without it the constructor raises an
    ImportError that says how to install it.

    Example::

        trainer.fit(data, epochs=3, callbacks=[TensorBoard("runs/tb")])
    """

    def __init__(self, log_dir: str | None = None, update_freq: str | int = "epoch", histogram_freq: int = 0) -> None:
        super().__init__()
        self._writer_cls = _summary_writer_class()
        self.log_dir = log_dir
        self.update_freq = update_freq
        self.histogram_freq = int(histogram_freq)  # every N optimizer steps: parameter and gradient histograms
        self.writer = None
        self._hook = None

    def on_train_begin(self, logs=None):
        if is_rank_zero():
            log_dir = self.log_dir or str(Path(self.trainer.run_dir) / "tensorboard")
            self.writer = self._writer_cls(log_dir=log_dir)
            if self.histogram_freq > 0 and self._hook is None:  # grads exist only until the step clears them
                self._hook = self.trainer.optimizer.register_step_pre_hook(self._histograms)

    def _histograms(self, optimizer, args, kwargs):
        step = self.trainer.global_step + 1  # the step about to be taken
        if self.writer is None or step % self.histogram_freq:
            return
        for name, p in self.trainer.network.named_parameters():
            self.writer.add_histogram(f"params/{name}", p.detach().float().cpu(), step)
            if p.grad is not None:
                self.writer.add_histogram(f"grads/{name}", p.grad.detach().float().cpu(), step)

    def on_train_batch_end(self, step, logs=None):
        if self.writer is None or self.update_freq == "epoch" or not logs:
            return
        gs = self.trainer.global_step
        if self.trainer.at_step_boundary and gs % int(self.update_freq) == 0:
            for k, v in logs.items():
                if k != "batch_size":
                    self.writer.add_scalar(f"batch/{k}", _plain(v), gs)

    def on_epoch_end(self, epoch, logs=None):
        if self.writer is None:
            return
        from .loggers import learning_rates

        logs = dict(logs or {})
        if not any(k == "lr" or k.startswith("lr/") for k in logs) and self.trainer.optimizer is not None:
            logs.update(learning_rates(self.trainer.optimizer))
        for k, v in logs.items():
            self.writer.add_scalar(f"epoch/{k}", _plain(v), epoch)
        self.writer.flush()

    def on_train_end(self, logs=None):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None


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
              "world_size": trainer._connector.world_size}
    first = [cb for cb in given if isinstance(cb, LearningRateMonitor)]  # its lr feeds every logger and History
    rest = [cb for cb in given if not isinstance(cb, LearningRateMonitor)]
    return CallbackList(first + extra + rest, trainer=trainer, params=params)


from .ema import EMA  # noqa: E402
from .extra_callbacks import (  # noqa: E402  (they subclass the classes above)
    BackupAndRestore,
    LambdaCallback,
    LearningRateScheduler,
    ProgBarLogger,
    ReduceLROnPlateau,
    VisualDL,
)
from .hapi_callbacks import config_callbacks  # noqa: E402
