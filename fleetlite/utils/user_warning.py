"""Warnings that point at the user's line, not at fleetlite's internals.

``warnings.warn(msg, stacklevel=2)`` from a callback or a loop shows a line
inside fleetlite, which tells the user nothing. :func:`warn_user` attributes
the warning to the first frame outside the ``fleetlite`` package (the user's
``trainer.fit(...)`` call, a recipe's line), and :func:`warn_once` does so
only the first time a given key is seen in the process.

Example::

    from fleetlite.utils.user_warning import warn_once
    warn_once("cpu-amp", "fleetlite: AMP on the CPU is slow here")
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

__all__ = ["warn_user", "warn_once"]

_PACKAGE = str(Path(__file__).resolve().parents[1])
_SEEN: set[str] = set()


def _outside_level() -> int:
    """The ``stacklevel`` (for a call made in our caller) of the first frame outside the package."""
    frame, level = sys._getframe(2), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the user's code (the first caller outside fleetlite)."""
    warnings.warn(message, category, stacklevel=_outside_level() + 1)


def warn_once(key: str, message: str, category: type[Warning] = UserWarning) -> None:
    """:func:`warn_user`, the first time ``key`` is seen in this process only."""
    if key in _SEEN:
        return
    _SEEN.add(key)
    warnings.warn(message, category, stacklevel=_outside_level() + 1)
