"""``LearningRateMonitor``: puts the optimizer's learning rates into the logs every logger reads.

Public through :mod:`fleetlite.callbacks`.
"""

from __future__ import annotations

from typing import Any

from .base import Callback

__all__ = ["LearningRateMonitor", "learning_rates", "param_groups"]


def learning_rates(optimizer) -> dict[str, float]:
    """``{"lr": x}`` for one param group, ``{"lr/pg0": x, "lr/pg1": y, ...}`` for several."""
    groups = getattr(optimizer, "param_groups", None) or []
    lrs = [float(g["lr"]) for g in groups]
    if len(lrs) == 1:
        return {"lr": lrs[0]}
    return {f"lr/pg{i}": v for i, v in enumerate(lrs)}


def param_groups(opt: Any) -> list[dict[str, Any]]:
    """The param groups of ``opt`` (the user's optimizer), whose ``lr`` a callback changes."""
    if opt is None:
        raise ValueError("this callback changes the learning rate, but the model has no optimizer; give one to "
                         "prepare()/compile() first")
    return opt.param_groups


class LearningRateMonitor(Callback):
    """Adds the optimizer's learning rate of each param group to the logs (``lr`` or ``lr/pg<i>``).

    ``logging_interval``: ``"step"`` (every optimizer step's batch logs, and the epoch logs) or ``"epoch"``
    (epoch logs only). ``fit`` runs it before the other callbacks so every logger (CSVLogger, TensorBoard,
    MLflowLogger, WandbCallback, History) records the rate; the value is the rate the step just used.

    Example::

        trainer.fit(data, epochs=5, callbacks=[LearningRateMonitor(), LRScheduler(sched), CSVLogger()])
    """

    def __init__(self, logging_interval: str = "step") -> None:
        super().__init__()
        if logging_interval not in ("step", "epoch"):
            raise ValueError(f"LearningRateMonitor(logging_interval={logging_interval!r}): use 'step' or 'epoch'")
        self.logging_interval = logging_interval

    def _lrs(self) -> dict[str, float]:
        return learning_rates(self.trainer.optimizer) if self.trainer.optimizer is not None else {}

    def on_train_batch_begin(self, step, logs=None):
        # read before the step: a per-step scheduler may move the rate when the step ends, and the value
        # logged is the rate this step used (the last rate of a cosine run is never used: it is 0)
        self._used = self._lrs()

    def on_train_batch_end(self, step, logs=None):
        if self.logging_interval == "step" and logs is not None:
            logs.update(getattr(self, "_used", None) or self._lrs())

    def on_epoch_end(self, epoch, logs=None):
        # the rate the epoch's last step used (read from the optimizer, so a resumed run logs what the
        # uninterrupted one did); before a per-epoch LRScheduler steps (this callback runs first)
        if logs is not None:
            logs.update(getattr(self, "_used", None) or self._lrs())
