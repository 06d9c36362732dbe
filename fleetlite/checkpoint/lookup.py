"""Finding checkpoints of either kind (files and DCP directories): one list, one "newest valid", one cleanup.

A run's checkpoint directory may hold checkpoint files (``step-00000010.pt``,
:mod:`.files`), checkpoint directories (``step-00000010/``, :mod:`.dcp`), the
``latest`` pointer (Note [latest pointer]) and temporaries of saves that died
midway. Every rule about them is written here once: which entries are
checkpoints (:func:`list_checkpoints`), which is the newest valid one
(:func:`find_newest`, :func:`load_newest`), what is stale
(:func:`remove_stale`), whether a fresh run would overwrite an earlier one
(:func:`earlier_checkpoints`), and how every rank reads one and fails
together (:func:`on_every_rank`).

Example::

    import fleetlite.checkpoint as ckpt
    found = ckpt.load_newest("runs/a/checkpoints", require=["model"])  # a LoadedCheckpoint, or None
    weights = ckpt.load_full("runs/a/checkpoints")                      # the newest directory's full weights
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..distributed import collective
from ..utils.user_warning import warn_user
from . import dcp
from .files import CheckpointError, LoadedCheckpoint, load_checkpoint
from .pointer import LATEST, LATEST_FILE, pointed

__all__ = ["list_checkpoints", "read", "load_newest", "find_newest", "resolve", "remove_stale",
           "earlier_checkpoints", "warn_if_overwriting", "on_every_rank", "load_full"]

T = TypeVar("T")
_TMP_FILE = re.compile(r"^\..*\.tmp-[0-9a-f]+$")  # Note [atomic checkpoint]
KINDS = (None, "file", "dir")


def _kind(p: Path) -> str | None:
    """``"file"``/``"dir"`` for a committed-looking checkpoint (not a pointer, not a temporary), else None."""
    if p.name.startswith(".") or p.name in (LATEST, LATEST_FILE):
        return None
    if p.is_file() and p.suffix == ".pt":
        return "file"
    if p.is_dir() and (p / dcp.MARKER).exists():
        return "dir"
    return None


def _mtime(p: Path) -> int:
    try:
        return (p / dcp.MARKER if p.is_dir() else p).stat().st_mtime_ns
    except OSError:
        return 0


def list_checkpoints(root: str | os.PathLike, kind: str | None = None) -> list[Path]:
    """Committed-looking checkpoints in ``root`` (``kind``: ``"file"``, ``"dir"`` or either), newest first."""
    if kind not in KINDS:
        raise ValueError(f"kind must be 'file', 'dir' or None, got {kind!r}")
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _kind(p) is not None and (kind is None or _kind(p) == kind)]
    return sorted(found, key=lambda p: (_mtime(p), p.name), reverse=True)


def _candidates(root: Path, kind: str | None) -> list[Path]:
    """What the pointers name (newest first), then every listed checkpoint newest first."""
    ptr = [p for p in pointed(root) if kind is None or ("dir" if p.suffix != ".pt" else "file") == kind]
    ptr.sort(key=_mtime, reverse=True)
    return ptr + [p for p in list_checkpoints(root, kind) if p not in ptr]


def read(path: str | os.PathLike, require: Iterable[str] = ()) -> LoadedCheckpoint:
    """One checkpoint of either kind, checked and its entries read (``CheckpointError`` naming the problem).

    A directory is validated (:func:`fleetlite.checkpoint.validate`) and its rank-0 entries (``trainer.pt``)
    read; without them its marker is the state (then ``require`` must be empty).
    """
    path = Path(path)
    if not path.is_dir():
        return LoadedCheckpoint(path, load_checkpoint(path, require=require))
    meta = dcp.validate(path)
    if (path / dcp.RANK0_FILE).exists() or tuple(require):
        return LoadedCheckpoint(path, load_checkpoint(path / dcp.RANK0_FILE, require=require))
    return LoadedCheckpoint(path, meta)


def load_newest(root: str | os.PathLike, *, require: Iterable[str] = (), kind: str | None = None,
                warn: bool = True) -> LoadedCheckpoint | None:
    """The newest valid checkpoint in ``root``, read: what ``latest`` names when valid, else the newest valid one.

    Falls back with a warning naming each skipped checkpoint and why; ``None`` when there is no valid one.
    """
    root = Path(root)
    problems = []
    for p in _candidates(root, kind):
        try:
            found = read(p, require)
        except CheckpointError as e:
            problems.append(f"{p.name}: {e.problem}")
            continue
        if problems and warn:
            what = "sharded checkpoint(s)" if p.is_dir() else "checkpoint(s)"
            warn_user(f"fleetlite: skipped invalid {what} in {root} ({'; '.join(problems)}); falling back to {p.name}")
        return found
    if problems and warn:
        warn_user(f"fleetlite: no valid checkpoint in {root} ({'; '.join(problems)})")
    return None


def find_newest(root: str | os.PathLike, *, require: Iterable[str] = (), kind: str | None = None,
                warn: bool = True) -> Path | None:
    """The path of :func:`load_newest`'s checkpoint (``None`` when there is none)."""
    found = load_newest(root, require=require, kind=kind, warn=warn)
    return None if found is None else found.path


def resolve(target: Any, directory: str | os.PathLike | None = None, *, require: Iterable[str] = (),
            check: bool = True) -> Path | None:
    """The checkpoint ``target`` names, checked (``CheckpointError`` or ``ValueError`` saying what is wrong).

    ``"latest"``: the newest valid checkpoint in ``directory`` (an error when there is none); ``"auto"``: the
    same, or None; a checkpoint file (``NAME`` also finds ``NAME.pt``), checked with ``require``; a checkpoint
    directory, validated (``NAME.pt`` also finds the directory ``NAME/``, where a sharded save of ``NAME.pt``
    went); a ``latest`` pointer: the directory it names; a run's checkpoint directory: its newest valid checkpoint.
    ``check=False`` leaves a named file or directory unchecked (its reader checks it).
    """
    if target in ("latest", "auto") or target is True:
        if directory is None:
            raise ValueError(f"{target!r} needs a checkpoint directory: pass fit(..., save_dir=...) or a "
                             "ModelCheckpoint(save_dir=...)")
        found = find_newest(directory, require=require)
        if found is None and target != "auto":
            raise CheckpointError(directory, f"holds no valid checkpoint ({target!r}); use 'auto' to start fresh "
                                             "when there is none")
        return found
    p = Path(target)
    if p.suffix == "" and not p.exists() and p.with_suffix(".pt").exists():
        p = p.with_suffix(".pt")
    if p.suffix == ".pt" and not p.exists() and dcp.is_checkpoint_dir(p.with_suffix("")):
        p = p.with_suffix("")  # a hybrid model's save("NAME.pt") writes the directory NAME/
    if p.name == LATEST and p.is_file():  # a sharded run's pointer: a text file naming the directory
        p = p.parent / p.read_text().strip()
    if p.is_dir() and not dcp.is_checkpoint_dir(p) and not p.name.startswith("."):
        found = find_newest(p, require=require)
        if found is None:
            raise CheckpointError(p, "holds no valid checkpoint (no checkpoint file, no committed checkpoint "
                                     "directory); pass a checkpoint file or directory")
        return found
    if check:  # a clear error now, before any work
        read(p, require) if p.is_dir() else load_checkpoint(p, require=require)
    return p


def remove_stale(root: str | os.PathLike) -> list[Path]:
    """Delete what saves that died midway left in ``root`` (temporary files and directories); returns them.

    Call it only when no save is running into ``root`` (e.g. at the start of training).
    """
    root = Path(root)
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if (p.is_file() and _TMP_FILE.match(p.name)) or
             (p.is_dir() and p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name))]
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                p.unlink()
            except OSError:
                pass
    return stale


def earlier_checkpoints(root: str | os.PathLike | None) -> str | None:
    """The checkpoints (and pointers) an earlier run left in ``root``, named in a short text; None when none."""
    if root is None:
        return None
    root = Path(root)
    found = [p.name for p in list_checkpoints(root)] + [n for n in (LATEST_FILE, LATEST) if (root / n).exists()]
    if not found:
        return None
    return ", ".join(sorted(found)[:3]) + (" ..." if len(found) > 3 else "")


def warn_if_overwriting(directory: str | os.PathLike | None) -> None:
    """Warn (rank 0) when a fresh run is about to overwrite the checkpoints an earlier run left in ``directory``."""
    if collective.get_rank() != 0:
        return
    shown = earlier_checkpoints(directory)
    if shown:
        warn_user(f"fleetlite: {directory} already holds the checkpoints of an earlier run ({shown}); this fresh "
                  "run overwrites them as it saves. Continue that run with fit(..., resume='latest'), use another "
                  "save_dir, or pass resume=False to start afresh deliberately (no warning)")


def on_every_rank(read_it: Callable[[], T]) -> T:
    """``read_it()`` on every rank; when it raises ``CheckpointError`` on any rank, every rank raises the first
    such message (no rank goes on alone to hang in the next collective)."""
    value, error = None, None
    try:
        value = read_it()
    except CheckpointError as e:
        error = str(e)
    if collective.is_initialized():
        errors = [e for e in collective.all_gather_object(error) if e is not None]
        error = errors[0] if errors else None
    if error is not None:
        raise CheckpointError(None, error)
    return value


def load_full(path: str | os.PathLike, model: torch.nn.Module | None = None, key: str = "model"
              ) -> dict[str, Any]:
    """The full (unsharded) weights of any checkpoint ``fit`` writes, offline (no process group), on the CPU.

    ``path``: a checkpoint directory (its shards gathered), a checkpoint file (``NAME`` also finds ``NAME.pt``), a
    ``latest`` pointer (the checkpoint it names), or a run's checkpoint directory (its newest valid checkpoint of
    either kind). With ``model`` the weights are also loaded into it (``strict``: a checkpoint of another model is
    a ``CheckpointError`` naming the missing and unexpected keys).

    Example::

        weights = fleetlite.checkpoint.load_full("runs/a/checkpoints")          # the newest, file or directory
        fleetlite.checkpoint.load_full("runs/a/checkpoints/latest.pt", model=net)
    """
    found = resolve(path, check=False)  # NAME -> NAME.pt, latest -> what it names, a run's directory -> newest
    if found.is_dir():
        return dcp.read_full(found, model=model, key=key)
    state = load_checkpoint(found)
    weights = state.get(key)
    if not isinstance(weights, dict):
        raise CheckpointError(found, f"holds no {key!r} entry (its entries: {sorted(state)[:10]}); pass key=... to "
                                     "read another one")
    if model is not None:
        dcp.load_into(model, weights, found)
    return weights
