"""``LRScheduler``: step a torch LR scheduler per epoch or per optimizer step (the Trainer's way), and
``find_scheduler``, the scheduler driving an optimizer (Paddle's ``LRScheduler`` uses it too).

Public through :mod:`fleetlite.trainer.callbacks`.
"""

from __future__ import annotations

import gc
import re
import warnings
from typing import Any

from torch.optim.lr_scheduler import LRScheduler as TorchScheduler
from torch.optim.lr_scheduler import ReduceLROnPlateau as TorchPlateau

from .base import Callback

__all__ = ["LRScheduler", "find_scheduler", "step_quietly"]


def step_quietly(scheduler: Any, *args: Any) -> None:
    """``scheduler.step(*args)`` without torch's order warning.

    A resumed run may reach an epoch end before its first optimizer step, and Paddle's per-batch stepping steps
    inside an accumulation window: the order is right, torch's heuristic ("lr_scheduler.step() before
    optimizer.step()") knows about neither.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
        scheduler.step(*args)


class LRScheduler(Callback):
    """Step a torch LR scheduler per epoch or per optimizer step (the Trainer's way).

    ``LRScheduler(scheduler)`` steps ``scheduler`` at each epoch end, ``LRScheduler(scheduler, by_step=True)``
    after each optimizer step (once per gradient-accumulation window). Without a scheduler it steps the one
    driving the optimizer (:func:`find_scheduler`). Its state (the scheduler's ``state_dict``) is saved in
    checkpoints. ``monitor`` feeds an epoch log value to schedulers that need one (``ReduceLROnPlateau``).
    Works under either face; Paddle's ``LRScheduler(by_step=True, by_epoch=False)`` (per batch, the
    optimizer's scheduler) is :class:`fleetlite.callbacks.LRScheduler`.

    Example::

        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
        trainer.fit(data, epochs=30, callbacks=[LRScheduler(sched)])
        # per step, e.g. OneCycleLR:
        LRScheduler(torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=1000), by_step=True)
    """

    def __init__(self, scheduler: Any = None, by_step: bool = False, monitor: str | None = None) -> None:
        super().__init__()
        if scheduler is not None and (not hasattr(scheduler, "step") or not hasattr(scheduler, "state_dict")):
            paddle = " (Paddle's LRScheduler(by_step, by_epoch) is fleetlite.callbacks.LRScheduler)" \
                if isinstance(scheduler, bool) else ""
            raise TypeError(f"LRScheduler wraps a torch LR scheduler (with step() and state_dict()), got "
                            f"{type(scheduler).__name__}; e.g. LRScheduler(torch.optim.lr_scheduler.StepLR(opt, 10))"
                            + paddle)
        self._find = scheduler is None
        self.scheduler = scheduler
        self.by_step = bool(by_step)
        self.monitor = monitor

    def _step(self, logs):
        if self.monitor is None:
            step_quietly(self.scheduler)
            return
        if not logs or self.monitor not in logs:
            raise KeyError(f"LRScheduler(monitor={self.monitor!r}): no such value in the logs "
                           f"(available: {sorted(logs or {})}); pass eval_data to fit for val_* values")
        step_quietly(self.scheduler, float(logs[self.monitor]))

    def on_train_begin(self, logs=None):
        if self._find:
            self.scheduler = find_scheduler(self.trainer.user_optimizer)

    def on_train_batch_end(self, step, logs=None):
        if self.scheduler is not None and self.by_step and self.trainer.at_step_boundary:
            self._step(logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.scheduler is not None and not self.by_step:
            self._step(logs)

    def state_dict(self) -> dict[str, Any]:
        return {} if self.scheduler is None else {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scheduler is None and self._find and self.trainer is not None:
            self.scheduler = find_scheduler(self.trainer.user_optimizer)
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
