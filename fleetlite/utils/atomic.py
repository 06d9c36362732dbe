"""Atomic file writes: nothing a user saved is ever lost or half-written.

Note [atomic write]
    The data goes to a hidden temporary file beside the target
    (``.NAME.tmp-XXXXXXXXXXXX``), which is flushed and fsynced, then
    ``os.replace``d onto the name, and the directory is fsynced. A crash at
    any point leaves either the old file or the new one under the name, plus
    at worst a torn temporary file that readers never look at.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_open", "atomic_write_text", "fsync_dir", "temp_name", "default_permissions", "why_unwritable"]


def temp_name(path: str | os.PathLike) -> Path:
    """The hidden temporary name used while ``path`` is being written."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def default_permissions(path: str | os.PathLike) -> None:
    """Give ``path`` the mode a plain ``open(path, "w")`` gets (0666 less the umask, usually 0644): writers that
    create private files (safetensors' temporary file is 0600) would otherwise leave one artifact unlike the rest."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def why_unwritable(path: str | os.PathLike, e: OSError) -> str:
    """What stops writing to ``path``, for an error message: the OS reason, with the working directory or the
    missing folder named when the bare reason ("No such file or directory") would not say which."""
    try:
        cwd = os.getcwd()
    except OSError:
        return ("the working directory no longer exists (it was deleted or unmounted after this process started "
                "in it); cd into an existing directory or give an absolute path")
    reason = e.strerror or str(e)
    if isinstance(e, FileNotFoundError):
        missing = Path(os.path.join(cwd, path))
        while not missing.parent.exists() and missing.parent != missing:
            missing = missing.parent
        return f"{reason}: {missing} cannot be created"
    if not Path(path).is_absolute():
        return f"{reason}; relative to the working directory {cwd}"
    return reason


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", **kwargs) -> Iterator[IO]:
    """Open ``path`` for writing so that it is replaced only once the block succeeds.

    See Note [atomic write]. On any exception the temporary file is removed
    and the previous ``path`` is left untouched.

    Example::

        with atomic_open("metrics.csv", "w", encoding="utf-8") as f:
            f.write("epoch,loss\\n")
    """
    if not any(c in mode for c in "wx"):
        raise ValueError(f"atomic_open writes a new file; mode={mode!r} must contain 'w'")
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (creating the parent directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
