"""Checkpoint files: atomic writes, safe loads, integrity checks (finding the newest: :mod:`.lookup`).

Usable on its own (recipes, fault tolerance) as well as by the Trainer.

Format: one ``torch.save`` zip file holding a dict with ``"format":
"fleetlite.checkpoint"``, ``"version"`` and the caller's entries. Only tensors
and plain Python values are allowed (checked before anything is written), so
the file loads with ``torch.load(weights_only=True)`` and loading never needs
arbitrary unpickling; a file that does is refused.

# Note [atomic checkpoint]
A checkpoint is written to a hidden temporary file in the target directory,
flushed and fsynced, then ``os.replace``d onto its name, and the directory is
fsynced. A crash at any point leaves either the old file or the new one,
never a torn file; the ``latest.pt`` pointer is a hard link (a copy where
links are unsupported) swapped in the same way (Note [latest pointer] in
:mod:`.pointer`). Lookups ignore temporary files.

# Note [checkpoint integrity]
torch's zip reader does not verify CRCs, so a flipped byte inside a tensor
loads silently. ``load_checkpoint`` first checks every zip record's CRC32
(``zipfile.testzip``), so corruption anywhere in the file is reported.

Example::

    from fleetlite.checkpoint import save_checkpoint, load_checkpoint
    save_checkpoint({"model": net.state_dict(), "global_step": 10}, "ckpt/step-00000010.pt", latest=True)
    state = load_checkpoint("ckpt/latest.pt")
"""

from __future__ import annotations

import collections
import os
import pickle
import struct
import uuid
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..utils.atomic import atomic_open, why_unwritable
from .pointer import point_latest

__all__ = ["CheckpointError", "FORMAT", "VERSION", "save_checkpoint", "load_checkpoint", "check_plain",
           "LoadedCheckpoint", "probe_writable"]

FORMAT = "fleetlite.checkpoint"
VERSION = 1
# exact types: subclasses (numpy.float64 is a float, torch's TorchVersion a str) pickle as their own class
_PLAIN = frozenset({bool, int, float, complex, str, bytes, bytearray, type(None), torch.Size, torch.dtype,
                    torch.device})


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable, corrupted, unsafe or incompatible; ``path`` names it."""

    def __init__(self, path: str | os.PathLike | None, problem: str):
        self.path = None if path is None else str(path)
        self.problem = problem
        super().__init__(f"checkpoint {self.path}: {problem}" if path is not None else problem)


# -- writing -------------------------------------------------------------------
def check_plain(obj: Any, where: str = "state") -> None:
    """Raise ``TypeError`` naming the first entry that ``torch.load(weights_only=True)`` could not read back."""
    stack = [(obj, where)]
    while stack:
        value, path = stack.pop()
        if type(value) in _PLAIN or isinstance(value, torch.Tensor):
            continue
        if type(value) in (dict, collections.OrderedDict):
            for k, v in value.items():
                if not isinstance(k, (str, int, float, bool, type(None))):
                    raise TypeError(f"{path} has a key of type {type(k).__name__} ({k!r}); checkpoint keys must "
                                    "be str/int/float/bool/None")
                stack.append((v, f"{path}[{k!r}]"))
        elif type(value) in (list, tuple, set, frozenset):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
        else:
            raise TypeError(
                f"{path} is a {type(value).__module__}.{type(value).__qualname__}; a checkpoint holds only tensors "
                "and plain Python values (dict/list/tuple/str/int/float/bool/None) so that it loads with "
                "torch.load(weights_only=True). Convert it (e.g. return plain values from state_dict()).")


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike, *, latest: bool = False) -> Path:
    """Write ``state`` (tensors and plain values) atomically to ``path`` (Note [atomic checkpoint]); with
    ``latest`` point ``latest.pt`` at it. ``TypeError`` before writing anything when a value is not plain,
    ``CheckpointError`` when the write fails (the previous file stays)."""
    path = Path(path)
    if not isinstance(state, dict):
        raise TypeError(f"save_checkpoint expects a dict, got {type(state).__name__}")
    payload = {"format": FORMAT, "version": VERSION, **state}
    check_plain(payload)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(path, f"cannot create the directory {path.parent}: {e.strerror or e}; "
                                    "choose a writable save_dir") from e
    try:
        with atomic_open(path, "wb") as f:  # Note [atomic write]
            torch.save(payload, f)
    except (OSError, RuntimeError) as e:
        # a real failed write (disk full, file-size limit) surfaces from torch's zip writer as a RuntimeError
        # ("[enforce fail at inline_container.cc] unexpected pos"), the OSError being its context
        raise CheckpointError(path, f"writing failed ({_write_error(e)}); the previous checkpoint, if any, is "
                                    "unchanged. Free disk space or choose a writable save_dir") from e
    if latest:
        point_latest(path)  # Note [latest pointer]
    return path


def _write_error(e: BaseException) -> str:
    """The OS reason of a failed write: the ``OSError`` itself or the one behind torch's zip-writer error."""
    seen = e
    while seen is not None and not isinstance(seen, OSError):
        seen = seen.__context__ or seen.__cause__
    if isinstance(seen, OSError):
        return seen.strerror or str(seen)
    return _first_line(e)


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _unpickling_detail(e: Exception) -> str:
    """The line of torch's refusal naming the class it would not unpickle."""
    text = [ln.strip() for ln in str(e).splitlines() if "Unsupported" in ln or "global" in ln.lower()]
    return text[0].replace("WeightsUnpickler error: ", "") if text else _first_line(e)


def probe_writable(directory: str | os.PathLike) -> Path:
    """Create ``directory`` if needed and prove a file can be written there; ``CheckpointError`` if not."""
    directory = Path(directory)
    probe = directory / f".write-test-{uuid.uuid4().hex[:8]}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"ok")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as e:
        raise CheckpointError(directory, f"is not writable ({why_unwritable(directory, e)}); checkpoints could not "
                                         "be saved. "
                                         "Choose a writable save_dir, or free disk space") from e
    return directory


# -- reading -------------------------------------------------------------------
def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", *, verify: bool = True,
                    require: Iterable[str] = ()) -> dict[str, Any]:
    """Load a checkpoint file safely (``weights_only=True``; with ``verify`` every CRC checked first, Note
    [checkpoint integrity]) holding the ``require``-d entries, else ``CheckpointError`` naming the problem."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "no such file; check the path (or resume=None to start fresh)")
    if path.is_dir():
        raise CheckpointError(path, "is a directory; read a checkpoint directory with fleetlite.checkpoint.read(path), "
                                    "or find the newest checkpoint in it with fleetlite.checkpoint.find_newest(path)")
    if verify and zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            raise CheckpointError(path, f"truncated or corrupted ({e}); use an older checkpoint") from e
        if bad is not None:
            raise CheckpointError(path, f"corrupted: record {bad!r} fails its CRC check (the file was damaged "
                                        "after it was written); use an older checkpoint")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(path, "unreadable (0 bytes): empty, a write that never completed; use an older "
                                    "checkpoint")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if not _needs_globals(e):  # not a pickle at all (an invalid opcode): garbage, not an unsafe file
            raise CheckpointError(path, f"unreadable ({size} bytes): not a checkpoint or corrupted "
                                        f"({_unpickling_detail(e)}); use an older checkpoint") from None
        raise CheckpointError(path, "refused: loading it needs arbitrary unpickling (it holds Python objects other "
                                    "than tensors and plain values, which could run code), so it was not loaded. "
                                    "If you trust its origin, load it yourself with torch.load(path, "
                                    f"weights_only=False). Detail: {_unpickling_detail(e)}") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, IndexError, KeyError, TypeError,
            AttributeError, struct.error, UnicodeDecodeError, MemoryError) as e:
        # a damaged file breaks torch's reader in many ways (IndexError, struct.error, KeyError, ...)
        raise CheckpointError(path, f"unreadable ({size} bytes): truncated or corrupted "
                                    f"({type(e).__name__}: {_first_line(e)}); use an older checkpoint") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        kind = type(state).__name__ if not isinstance(state, dict) else "a dict without the fleetlite format marker"
        raise CheckpointError(path, f"not a fleetlite checkpoint (found {kind}); write one with save_checkpoint "
                                    "or Trainer.save")
    if not isinstance(state.get("version"), int) or state["version"] > VERSION:
        raise CheckpointError(path, f"format version {state.get('version')!r} is newer than this fleetlite "
                                    f"understands ({VERSION}); upgrade fleetlite")
    missing = [k for k in require if k not in state]
    if missing:
        raise CheckpointError(path, f"incompatible: lacks {missing}; it was not written by Trainer checkpointing")
    return state


def _needs_globals(e: Exception) -> bool:
    """Whether torch's safe unpickler refused a class/function (a real unsafe file), not a garbage byte."""
    text = str(e)
    return "global" in text.lower() or "Unsupported class" in text or "allowlist" in text


class LoadedCheckpoint(NamedTuple):
    """A checkpoint read once: its ``path`` and its entries ``state`` (``os.fspath`` gives the path).

    For a checkpoint file ``state`` is the file's dict; for a checkpoint directory, the entries rank 0 wrote
    beside the shards (``trainer.pt``), or the directory's marker when it has none. Hand it to
    ``Trainer.fit(resume=...)`` so the checkpoint is not read a second time.

    Example::

        found = fleetlite.checkpoint.load_latest("outputs/run/checkpoints", require=["model"])
        trainer.fit(data, resume=found)
    """

    path: Path
    state: dict[str, Any]

    def __fspath__(self) -> str:
        return str(self.path)
