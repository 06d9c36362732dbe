"""``LRScheduler``: step a torch LR scheduler per epoch or per optimizer step (Paddle's and the Trainer's way).

Public through :mod:`fleetlite.callbacks`.
"""

from __future__ import annotations

import gc
import re
import warnings
from typing import Any

from torch.optim.lr_scheduler import LRScheduler as TorchScheduler
from torch.optim.lr_scheduler import ReduceLROnPlateau as TorchPlateau

from .base import Callback

__all__ = ["LRScheduler", "find_scheduler"]


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


def find_scheduler(optimizer: Any) -> Any:
    """The torch LR scheduler driving ``optimizer`` (Paddle's optimizers own theirs; torch's do not).

    Looked up as ``optimizer._learning_rate`` / ``optimizer.lr_scheduler`` when set, else among the
    live schedulers whose ``.optimizer`` is this optimizer (the outermost one when schedulers are chained).
    ``ReduceLROnPlateau`` is left out (it needs a metric: use the ``ReduceLROnPlateau`` callback).
    """
    if optimizer is None:
        return None
    opt = getattr(optimizer, "inner_opt", optimizer)
    for attr in ("_learning_rate", "lr_scheduler"):
        s = getattr(opt, attr, None)
        if s is not None and hasattr(s, "step") and hasattr(s, "state_dict"):
            return s
    found = []
    for ref in gc.get_referrers(opt):
        if isinstance(ref, TorchScheduler):
            owners = [ref]
        elif isinstance(ref, dict) and ref.get("optimizer") is opt:  # a scheduler's __dict__
            owners = [o for o in gc.get_referrers(ref) if isinstance(o, TorchScheduler)]
        else:
            owners = []
        for s in owners:
            if getattr(s, "optimizer", None) is opt and not isinstance(s, TorchPlateau) and s not in found:
                found.append(s)
    inner = {id(c) for s in found for c in getattr(s, "_schedulers", [])}
    found = [s for s in found if id(s) not in inner]
    if len(found) > 1:
        raise ValueError(f"{len(found)} LR schedulers drive this optimizer ({[type(s).__name__ for s in found]}); "
                         "pass the one to step: LRScheduler(scheduler) or optimizer.lr_scheduler = scheduler")
    return found[0] if found else None
