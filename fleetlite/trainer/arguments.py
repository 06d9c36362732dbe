"""Checks of the arguments the Trainer's public methods take."""

from __future__ import annotations

from typing import Any

__all__ = ["check_positive"]


def check_positive(**values: Any) -> None:
    """Raise ValueError naming the first argument that is not a positive integer (None is allowed)."""
    for name, v in values.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name}={v!r} must be a positive integer")
