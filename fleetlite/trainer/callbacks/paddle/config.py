"""The callback list of Paddle's hapi: the defaults ``fleetlite.Model.fit`` adds (Paddle's ``config_callbacks``)
and ``PaddleCallbackList``, Paddle's mode-named dispatch (``on_begin('train')``, ``on_batch_end('eval', step)``).

Not exported by :mod:`fleetlite.callbacks` (it holds callbacks only); ``config_callbacks`` is public as
``fleetlite.hapi.callbacks.config_callbacks``.
"""

from __future__ import annotations

from typing import Any

from ..base import Callback
from ..callback_list import CallbackList
from ..progress import ProgBarLogger, ProgressBar
from .early_stopping import EarlyStopping
from .lr_scheduler import LRScheduler
from .model_checkpoint import ModelCheckpoint

__all__ = ["paddle_fit_callbacks", "PaddleCallbackList"]


def _as_list(callbacks: Any) -> list[Callback]:
    return list(callbacks) if isinstance(callbacks, (list, tuple)) else ([callbacks] if callbacks else [])


def paddle_fit_callbacks(callbacks: Any, save_dir: str | None, save_freq: int, log_freq: int,
                         verbose: int) -> list[Callback]:
    """Paddle's ``config_callbacks`` defaults: a ``ProgBarLogger(log_freq, verbose)`` first (unless a progress
    display is given or ``verbose=0``), the user's callbacks, a ``ModelCheckpoint(save_freq, save_dir)`` and an
    ``LRScheduler()`` (per batch) unless given; Paddle's ``EarlyStopping`` gets ``save_dir``."""
    cbks = _as_list(callbacks)
    if verbose and not any(isinstance(k, ProgressBar) for k in cbks):
        cbks = [ProgBarLogger(log_freq, verbose=verbose), *cbks]
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
