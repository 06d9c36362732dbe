"""The ``latest`` pointer of a checkpoint directory, and atomic aliases.

# Note [latest pointer]
A run's checkpoint directory names its newest checkpoint with one pointer,
whose form follows the checkpoint's kind: a checkpoint file's pointer is
``latest.pt``, a hard link to the file (a copy where links are unsupported),
so that ``torch.load("latest.pt")`` works; a checkpoint directory's pointer is
``latest``, a text file holding the directory's name (directories cannot be
hard-linked). Both are replaced atomically after the checkpoint is complete,
so a pointer never names a torn checkpoint. :func:`point_latest` writes
either form; :func:`fleetlite.checkpoint.lookup.candidates` reads both.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..utils.atomic import atomic_write_text, fsync_dir, temp_name

__all__ = ["LATEST", "LATEST_FILE", "point_latest", "pointed", "atomic_alias"]

LATEST = "latest"
LATEST_FILE = "latest.pt"


def point_latest(checkpoint: str | os.PathLike) -> Path:
    """Point its directory's ``latest`` pointer at ``checkpoint`` (a file or a directory), atomically."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        atomic_write_text(checkpoint.parent / LATEST, checkpoint.name)
        return checkpoint.parent / LATEST
    return atomic_alias(checkpoint, checkpoint.parent / LATEST_FILE)


def pointed(root: str | os.PathLike) -> list[Path]:
    """What the pointers in ``root`` name: ``latest.pt`` itself (a link to the file), the directory ``latest`` names."""
    root = Path(root)
    out = [root / LATEST_FILE] if (root / LATEST_FILE).is_file() else []
    if (root / LATEST).is_file():
        try:
            out.append(root / (root / LATEST).read_text().strip())
        except OSError:
            pass
    return out


def atomic_alias(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Make ``dst`` a hard link to (or, failing that, a copy of) ``src``, atomically replacing ``dst``."""
    src, dst = Path(src), Path(dst)
    tmp = temp_name(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, dst)
        fsync_dir(dst.parent)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return dst
