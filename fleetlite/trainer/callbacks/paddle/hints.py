"""What to tell a user whose Paddle callback watches a value the evaluation logs do not hold."""

from __future__ import annotations

from typing import Any

__all__ = ["evaluation_hint"]


def evaluation_hint(monitor: str, logs: dict[str, Any] | None) -> str:
    """`` (available: [...]); ...``: the evaluation logs' keys, and for a Keras-style ``val_*`` name the fix."""
    keys = sorted(k for k in (logs or {}) if k != "batch_size")
    hint = f" {monitor!r} is not in the evaluation logs (available: {keys})"
    if monitor.startswith("val_"):
        hint += (f"; Paddle's callbacks read the evaluation logs, without the val_ prefix (monitor={monitor[4:]!r}); "
                 "for Keras' rule on the epoch logs use the class of fleetlite.trainer.callbacks")
    return hint
