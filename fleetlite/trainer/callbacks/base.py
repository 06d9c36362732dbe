"""The ``Callback`` base class: the hooks the Trainer fires, each doing nothing until overridden.

Hooks and their arguments follow Keras (``on_train_batch_end(step, logs)``,
``on_epoch_end(epoch, logs)``, ...). ``callback.model`` (Paddle's name) and
``callback.trainer`` are the running :class:`~fleetlite.Trainer`;
``callback.params`` holds ``epochs``, ``steps``, ``verbose``, ``log_freq``...
Per-batch logs are rank-local running values (0-d tensors or floats, as in
Keras 3); epoch logs are exact values reduced over all ranks, plain floats.

Every callback has ``state_dict()``/``load_state_dict()`` so its state goes
into the checkpoint and a resumed run continues where it stopped.

Public through :mod:`fleetlite.callbacks`.
"""

from __future__ import annotations

from typing import Any

from ...distributed import collective

__all__ = ["Callback", "HOOKS", "is_rank_zero", "to_python"]

HOOKS = (
    "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
    "on_train_batch_begin", "on_train_batch_end",
    "on_eval_begin", "on_eval_end", "on_eval_batch_begin", "on_eval_batch_end",
    "on_predict_begin", "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end",
)


def is_rank_zero() -> bool:
    """True on rank 0 (and single-process)."""
    return collective.get_rank() == 0


def to_python(v: Any) -> Any:
    """A 0-d tensor (or numpy scalar) as a Python number; anything else as it is (for logs)."""
    return v.item() if hasattr(v, "item") else v


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
        """The Trainer running the callback: ``self.model``, or the Trainer of the ``fleetlite.Model`` a Paddle
        script gave to ``set_model`` (Paddle's callbacks see the ``paddle.Model`` as ``self.model``)."""
        return getattr(self.model, "trainer", self.model)

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

    def on_exception(self, error: BaseException) -> None:
        """``fit`` is ending with ``error`` (raised again after every callback saw it): release what you hold."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
