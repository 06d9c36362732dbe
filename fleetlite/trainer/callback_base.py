"""The ``Callback`` base class, ``CallbackList`` (the dispatcher) and ``History``.

Public through :mod:`fleetlite.callbacks`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..utils.user_warning import warn_user

__all__ = ["Callback", "CallbackList", "History", "HOOKS", "is_rank_zero"]

HOOKS = (
    "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
    "on_train_batch_begin", "on_train_batch_end",
    "on_eval_begin", "on_eval_end", "on_eval_batch_begin", "on_eval_batch_end",
    "on_predict_begin", "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end",
)


def is_rank_zero() -> bool:
    """True on rank 0 (and single-process)."""
    from ..distributed import collective

    return collective.get_rank() == 0


class Callback:
    """Base class of callbacks: override the hooks you need (all default to doing nothing).

    ``self.model`` / ``self.trainer``: the Trainer; ``self.params``: run
    parameters (``epochs``, ``steps``, ``verbose``, ``log_freq``,
    ``batch_size``, ``world_size``). Override ``state_dict``/``load_state_dict``
    (plain values and tensors only) when the callback has state worth
    resuming.

    Example::

        class CountSteps(Callback):
            def __init__(self):
                super().__init__()
                self.steps = 0

            def on_train_batch_end(self, step, logs=None):
                self.steps += 1

            def state_dict(self):
                return {"steps": self.steps}

            def load_state_dict(self, state):
                self.steps = state["steps"]
    """

    def __init__(self) -> None:
        self.model = None
        self.params: dict[str, Any] = {}

    @property
    def trainer(self):
        return self.model

    def set_model(self, model) -> None:
        self.model = model

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params

    def on_train_begin(self, logs=None): ...
    def on_train_end(self, logs=None): ...
    def on_epoch_begin(self, epoch, logs=None): ...
    def on_epoch_end(self, epoch, logs=None): ...
    def on_train_batch_begin(self, step, logs=None): ...
    def on_train_batch_end(self, step, logs=None): ...
    def on_eval_begin(self, logs=None): ...
    def on_eval_end(self, logs=None): ...
    def on_eval_batch_begin(self, step, logs=None): ...
    def on_eval_batch_end(self, step, logs=None): ...
    def on_predict_begin(self, logs=None): ...
    def on_predict_end(self, logs=None): ...
    def on_predict_batch_begin(self, step, logs=None): ...
    def on_predict_batch_end(self, step, logs=None): ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


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


def _make_hook(name: str):
    def hook(self, *args):
        self._call(name, *args)

    hook.__name__ = name
    return hook


for _name in HOOKS:
    setattr(CallbackList, _name, _make_hook(_name))


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
            self.history.setdefault(k, []).append(v.item() if hasattr(v, "item") else v)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": list(self.epoch), "history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = list(state["epoch"])
        self.history = {k: list(v) for k, v in state["history"].items()}
