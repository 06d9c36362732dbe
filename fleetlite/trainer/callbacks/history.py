"""``History``: the epoch logs of a fit, which ``fit`` returns. Public through :mod:`fleetlite.callbacks`."""

from __future__ import annotations

from typing import Any

from .base import Callback, to_python

__all__ = ["History"]


class History(Callback):
    """Records the epoch logs: ``history.history["val_acc"][e]`` is epoch ``e``'s value.

    ``fit`` adds one and returns it; its state is checkpointed so a resumed
    run returns the whole history.

    Example::

        h = trainer.fit(data, eval_data=val, epochs=3)
        print(h.epoch, h.history["loss"])
    """

    def __init__(self) -> None:
        super().__init__()
        self.epoch: list[int] = []
        self.history: dict[str, list[Any]] = {}

    def on_train_begin(self, logs=None):
        self.epoch = []
        self.history = {}

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.append(epoch)
        for k, v in (logs or {}).items():
            self.history.setdefault(k, []).append(to_python(v))

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": list(self.epoch), "history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = list(state["epoch"])
        self.history = {k: list(v) for k, v in state["history"].items()}
