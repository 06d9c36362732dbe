"""Paddle's ``LRScheduler(by_step=True, by_epoch=False)``: steps the optimizer's own LR scheduler after every
training batch or every epoch. Public as ``fleetlite.callbacks.LRScheduler``."""

from __future__ import annotations

from typing import Any

from ..base import Callback
from ..lr_scheduler import find_scheduler, step_quietly

__all__ = ["LRScheduler"]


class LRScheduler(Callback):
    """Paddle's ``LRScheduler``: step the scheduler that drives the optimizer after every training batch
    (``by_step``) or every epoch (``by_epoch``).

    The scheduler is the optimizer's (``optimizer.lr_scheduler``, else the torch scheduler built on it; see
    :func:`~fleetlite.trainer.callbacks.lr_scheduler.find_scheduler`); without one nothing happens, as Paddle
    with a float learning rate. As Paddle's, ``by_step`` steps once per training *batch*, also inside a
    gradient-accumulation window (``fit(accumulate_grad_batches=k)`` steps it k times per optimizer step).
    ``fleetlite.Model.fit`` adds ``LRScheduler()`` unless one is given. To step a scheduler of your choice per
    optimizer step, use :class:`fleetlite.trainer.callbacks.LRScheduler` (``LRScheduler(scheduler)``).

    Example::

        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        model.fit(train_set, batch_size=64, epochs=3, callbacks=LRScheduler(by_step=False, by_epoch=True))
    """

    def __init__(self, by_step: bool = True, by_epoch: bool = False) -> None:
        super().__init__()
        for name, v in (("by_step", by_step), ("by_epoch", by_epoch)):
            if not isinstance(v, bool):
                raise TypeError(f"LRScheduler({name}={v!r}): this is Paddle's LRScheduler(by_step=True, "
                                "by_epoch=False), which steps the optimizer's scheduler; to wrap a scheduler use "
                                "fleetlite.trainer.callbacks.LRScheduler(scheduler)")
        if by_step and by_epoch:
            raise ValueError("by_step option is mutually exclusive with by_epoch")
        self.by_step = by_step
        self.by_epoch = by_epoch
        self.scheduler: Any = None

    def on_train_begin(self, logs=None):
        self.scheduler = find_scheduler(self.trainer.user_optimizer)

    def on_train_batch_end(self, step, logs=None):
        if self.by_step and self.scheduler is not None:
            step_quietly(self.scheduler)

    def on_epoch_end(self, epoch, logs=None):
        if self.by_epoch and self.scheduler is not None:
            step_quietly(self.scheduler)

    def state_dict(self) -> dict[str, Any]:
        return {} if self.scheduler is None else {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scheduler is None:
            self.scheduler = find_scheduler(self.trainer.user_optimizer) if self.trainer is not None else None
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
