"""Moved: the checkpoint file format lives in :mod:`fleetlite.checkpoint` (this module keeps the old names).

``LATEST``, ``list_checkpoints``, ``load_latest_checkpoint`` and ``find_latest_checkpoint`` here mean checkpoint
*files* only, as before; :func:`fleetlite.checkpoint.find_newest` / ``load_newest`` take both kinds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..checkpoint import (  # noqa: F401 - re-exported
    CheckpointError,
    LoadedCheckpoint,
    atomic_alias,
    capture_rng_state,
    check_plain,
    load_checkpoint,
    load_newest,
    probe_writable,
    restore_rng_state,
    save_checkpoint,
)
from ..checkpoint import list_checkpoints as _list
from ..checkpoint.pointer import LATEST_FILE as LATEST  # noqa: F401 - re-exported


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoint files in ``directory``, newest first: ``fleetlite.checkpoint.list_checkpoints(d, kind="file")``."""
    return _list(directory, kind="file")


def load_latest_checkpoint(directory: str | os.PathLike, *, require: Iterable[str] = (), warn: bool = True):
    """``fleetlite.checkpoint.load_newest(directory, kind="file", ...)``."""
    return load_newest(directory, require=require, kind="file", warn=warn)


def find_latest_checkpoint(directory: str | os.PathLike, *, require: Iterable[str] = (), warn: bool = True):
    """``fleetlite.checkpoint.find_newest(directory, kind="file", ...)``."""
    found = load_latest_checkpoint(directory, require=require, warn=warn)
    return None if found is None else found.path
