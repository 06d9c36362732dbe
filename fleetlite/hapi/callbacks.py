"""``paddle.hapi.callbacks`` names: the callbacks of :mod:`fleetlite.callbacks`, ``CallbackList`` and
``config_callbacks``.

Example::

    from fleetlite.hapi.callbacks import EarlyStopping, config_callbacks
"""

from __future__ import annotations

from typing import Any

from ..trainer.callbacks import *  # noqa: F401,F403
from ..trainer.callbacks import __all__ as _shared
from ..trainer.callbacks.paddle import *  # noqa: F401,F403
from ..trainer.callbacks.paddle import __all__ as _paddle
from ..trainer.callbacks.paddle.config import PaddleCallbackList, paddle_fit_callbacks
from ..trainer.model import Model

__all__ = [*_shared, *(n for n in _paddle if n not in _shared), "config_callbacks"]


def config_callbacks(callbacks: Any = None, model: Any = None, batch_size: int | None = None,
                     epochs: int | None = None, steps: int | None = None, log_freq: int = 2, verbose: int = 2,
                     save_freq: int = 1, save_dir: str | None = None, metrics: list[str] | None = None,
                     mode: str = "train") -> PaddleCallbackList:
    """Paddle's ``paddle.hapi.callbacks.config_callbacks``: the callback list a Paddle loop drives.

    ``model`` is a ``fleetlite.Model`` (its callbacks see the Trainer that runs it, as in ``Model.fit``) or a
    ``fleetlite.Trainer``.

    Example::

        cbks = config_callbacks(model=model, epochs=2, steps=10, verbose=0, metrics=["loss", "acc"])
        cbks.on_begin("train"); cbks.on_epoch_begin(0); cbks.on_epoch_end(0, {"loss": 1.0}); cbks.on_end("train")
    """
    cbks = paddle_fit_callbacks(callbacks, save_dir, save_freq, log_freq, verbose)
    params = {"batch_size": batch_size, "epochs": epochs, "steps": steps, "verbose": verbose,
              "metrics": (metrics or []) if mode != "test" else [], "log_freq": log_freq, "world_size": 1}
    trainer = model.trainer if isinstance(model, Model) else model
    return PaddleCallbackList(cbks, trainer=trainer, params=params)
