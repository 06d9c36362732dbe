""""Did it improve?": the monitor/mode/min_delta logic shared by EarlyStopping, ModelCheckpoint and
ReduceLROnPlateau.

Two rules pick the direction of ``mode="auto"``: Keras' (``"max"`` for accuracy-like names: ``acc``,
``auc``, ``precision``, ``recall``, ``f1``, case-insensitive; else ``"min"``), used under
``fleetlite.Trainer``, and Paddle's (``"max"`` when ``"acc"`` is in the name, case-sensitive), used under
``fleetlite.Model`` and by ``ReduceLROnPlateau``. A value improves on a reference when it beats it by
more than ``min_delta`` in that direction; every reference is beaten by the first value.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

__all__ = ["MonitorMixin", "resolve_mode", "missing_monitor", "monitor_value"]

_KERAS_MAX = ("acc", "auc", "precision", "recall", "f1")


def resolve_mode(mode: str, monitor: str, rule: str = "keras") -> str:
    """``"min"``/``"max"``; ``"auto"`` follows Keras' ``rule`` or Paddle's (see the module docstring)."""
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"mode={mode!r} is not one of 'auto', 'min', 'max'")
    if mode != "auto":
        return mode
    if rule == "paddle":
        return "max" if "acc" in monitor else "min"
    name = monitor.lower()
    return "max" if any(s in name for s in _KERAS_MAX) else "min"


def missing_monitor(monitor: str, logs: dict[str, Any] | None, params: dict[str, Any] | None = None) -> bool:
    """True when ``monitor`` is not in epoch ``logs`` although it should be; an epoch that was simply not
    evaluated (``params["eval_freq"]`` set, no ``val_*`` value in its logs) does not count."""
    logs = logs or {}
    if monitor in logs:
        return False
    evaluated = any(k.startswith("val_") for k in logs)
    return not (monitor.startswith("val_") and not evaluated and (params or {}).get("eval_freq"))


def monitor_value(logs: dict[str, Any] | None, key: str) -> float | None:
    """Paddle's reading of a monitored log value: the first of a list, a number, else None."""
    if not logs or key not in logs:
        return None
    v = logs[key]
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, np.ndarray) and v.size == 1:
        v = v.item()
    return float(v) if isinstance(v, numbers.Number) else None


class MonitorMixin:
    """Whether a monitored value improved, for callbacks with ``min_delta`` (see the module docstring).

    Example::

        class Best(MonitorMixin, Callback):
            def __init__(self):
                super().__init__()
                self.mode, self.min_delta, self.best = resolve_mode("auto", "val_acc"), 0.0, None

            def on_epoch_end(self, epoch, logs=None):
                if self._improves(float(logs["val_acc"]), self.best, self.mode):
                    self.best = float(logs["val_acc"])
    """

    min_delta: float

    def _improves(self, value: float, reference: float | None, mode: str) -> bool:
        """``value`` beats ``reference`` by more than ``min_delta`` in direction ``mode`` (None: always)."""
        if reference is None:
            return True
        if mode == "max":
            return value > reference + self.min_delta
        return value < reference - self.min_delta

    @staticmethod
    def _worst(mode: str) -> float:
        """The reference every value beats: ``-inf`` for ``"max"``, ``inf`` for ``"min"``."""
        return -math.inf if mode == "max" else math.inf
