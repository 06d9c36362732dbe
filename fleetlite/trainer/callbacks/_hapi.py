"""Paddle's hapi callback set-up behind ``fleetlite.Model``: ``config_callbacks`` (as
``paddle.hapi.callbacks.config_callbacks``) and the defaults ``Model.fit`` adds.

Not exported by :mod:`fleetlite.callbacks` (it holds callbacks only); ``config_callbacks`` is public as
``fleetlite.hapi.callbacks.config_callbacks``. The Paddle-mode behaviour of each shared callback lives in
that callback's own module (``trainer.paddle_hapi`` selects it).
"""

from __future__ import annotations

from typing import Any

from .base import Callback
from .callback_list import CallbackList
from .early_stopping import EarlyStopping
from .lr_scheduler import LRScheduler
from .model_checkpoint import ModelCheckpoint
from .progress import ProgBarLogger, ProgressBar

__all__ = ["config_callbacks", "config_fit_callbacks", "PaddleCallbackList"]


# -- callbacks of a Model.fit (Paddle's config_callbacks) --------------------------------------------------------
def config_fit_callbacks(model, callbacks: Any, save_dir: str | None, save_freq: int) -> list[Callback]:
    """The user's callbacks plus Paddle's defaults: a ModelCheckpoint(save_freq, save_dir) and an
    LRScheduler() stepping the optimizer's scheduler per batch; EarlyStopping gets ``save_dir``."""
    cbks = list(callbacks) if isinstance(callbacks, (list, tuple)) else ([callbacks] if callbacks else [])
    if not any(isinstance(k, ModelCheckpoint) for k in cbks):
        cbks.append(ModelCheckpoint(save_freq, save_dir))
    for k in cbks:
        if isinstance(k, EarlyStopping):
            k.save_dir = save_dir
    if not any(isinstance(k, LRScheduler) for k in cbks):
        cbks.append(LRScheduler())
    return cbks


class PaddleCallbackList(CallbackList):
    """Paddle's ``CallbackList`` methods (``on_begin(mode)``, ``on_batch_end(mode, step)``, ...) on ours."""

    _MODES = {"train": "train", "eval": "eval", "predict": "predict", "test": "predict"}

    def _mode(self, mode: str) -> str:
        if mode not in self._MODES:
            raise ValueError(f"mode should be train, eval or predict, got {mode!r}")
        return self._MODES[mode]

    def on_begin(self, mode: str, logs=None) -> None:
        self._call(f"on_{self._mode(mode)}_begin", logs)

    def on_end(self, mode: str, logs=None) -> None:
        self._call(f"on_{self._mode(mode)}_end", logs)

    def on_batch_begin(self, mode: str, step=None, logs=None) -> None:
        self._call(f"on_{self._mode(mode)}_batch_begin", step, logs)

    def on_batch_end(self, mode: str, step=None, logs=None) -> None:
        self._call(f"on_{self._mode(mode)}_batch_end", step, logs)


def config_callbacks(callbacks: Any = None, model=None, batch_size: int | None = None, epochs: int | None = None,
                     steps: int | None = None, log_freq: int = 2, verbose: int = 2, save_freq: int = 1,
                     save_dir: str | None = None, metrics: list[str] | None = None,
                     mode: str = "train") -> PaddleCallbackList:
    """Paddle's ``paddle.hapi.callbacks.config_callbacks``: the callback list a Paddle loop drives.

    Example::

        cbks = config_callbacks(model=model, epochs=2, steps=10, verbose=0, metrics=["loss", "acc"])
        cbks.on_begin("train"); cbks.on_epoch_begin(0); cbks.on_epoch_end(0, {"loss": 1.0}); cbks.on_end("train")
    """
    cbks = list(callbacks) if isinstance(callbacks, (list, tuple)) else ([callbacks] if callbacks else [])
    if not any(isinstance(k, ProgressBar) for k in cbks) and verbose:
        cbks = [ProgBarLogger(log_freq, verbose=verbose), *cbks]
    cbks = config_fit_callbacks(model, cbks, save_dir, save_freq)
    if not any(isinstance(k, LRScheduler) for k in cbks):
        cbks.append(LRScheduler())
    params = {"batch_size": batch_size, "epochs": epochs, "steps": steps, "verbose": verbose,
              "metrics": (metrics or []) if mode != "test" else [], "log_freq": log_freq, "world_size": 1}
    return PaddleCallbackList(cbks, trainer=model, params=params)
