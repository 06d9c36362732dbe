"""Sharded, reshardable, asynchronous checkpoints on ``torch.distributed.checkpoint`` (DCP).

A checkpoint is a directory: every rank writes its own shards (DCP's
``__<rank>_<n>.distcp`` files and ``.metadata``), rank 0 adds small files
of its own (the Trainer's ``trainer.pt``) and, last, ``fleetlite.json``.
DCP reshards on load, so a checkpoint written by 4 ranks at stage 3 loads on
2 ranks at stage 2, on one process, or offline into a plain module with
:func:`load_full`.

# Note [atomic checkpoint directory]
The directory is written under a hidden temporary name
(``.NAME.tmp-<hex>``) and renamed to ``NAME`` by rank 0 once DCP's save
finished on every rank (DCP's own finish step gathers every rank's write
results before rank 0 writes ``.metadata``); ``latest`` (a text file
holding the directory's name) is replaced atomically after the rename. A
rank killed mid-save leaves only a temporary directory, which lookups never
pick up and :func:`remove_stale` deletes; ``latest`` keeps pointing at the
previous complete checkpoint (Note [latest pointer]). Every lookup
(:mod:`.lookup`) validates what it picks (:func:`validate`): marker, metadata,
and every shard file the metadata names.

Example::

    import fleetlite.checkpoint as ckpt
    handle = ckpt.save({"model": model_sd}, "runs/a/step-00000100", async_save=True)  # collective
    handle.wait()                                       # collective; commits and points `latest` at it
    weights = ckpt.load_full("runs/a")                  # the newest; offline, no process group
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from ..distributed.agreement import from_rank0, side_group
from ..distributed.collective import is_initialized as _dist
from ..utils.atomic import atomic_write_text, fsync_dir
from .dcp_reader import SafeReader, read_metadata
from .files import CheckpointError
from .pointer import point_latest

__all__ = ["MARKER", "RANK0_FILE", "PendingSave", "save", "own_share", "load", "read_full", "validate", "saved_keys",
           "is_checkpoint_dir"]

MARKER = "fleetlite.json"
FORMAT = "fleetlite.dcp"
RANK0_FILE = "trainer.pt"  # the entries rank 0 writes beside the shards (a checkpoint file, files.py's format)


def _rank() -> int:
    return tdist.get_rank() if _dist() else 0


_DCP_NOTICE = "torch.distributed is disabled, unavailable or uninitialized"


@contextlib.contextmanager
def _dcp_call():
    """DCP warns on every single-process save and load ("torch.distributed is disabled ... assuming the intent is
    to save in a single process"): in one process that is exactly fleetlite's intent, so the notice is noise
    here. An async save still gives it (torch warns from its writer thread too, after any block of ours)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DCP_NOTICE)
        yield


def _ckpt_group():
    """A gloo group of its own, so a background save's collectives never interleave with training's."""
    return side_group("checkpoint")


def _from_rank0(value: Any) -> Any:
    return from_rank0(value, group=_ckpt_group())


def _barrier() -> None:
    if _dist():
        tdist.barrier(group=_ckpt_group())


class PendingSave:
    """A save in flight: :meth:`wait` (collective) finishes it and commits the directory (on rank 0)."""

    def __init__(self, future: Any, tmp: Path, final: Path, meta: dict[str, Any], latest: bool) -> None:
        self.future, self.tmp, self.final, self.meta, self.latest = future, tmp, final, meta, latest
        self.done = False
        self.error: BaseException | None = None

    def wait(self) -> Path:
        """Block until every rank's shards are written, commit, and return the directory (collective)."""
        if self.done:
            if self.error is not None:
                raise self.error
            return self.final
        try:
            if self.future is not None:
                self.future.result()
            if _rank() == 0:
                _commit(self.tmp, self.final, self.meta, self.latest)
        except BaseException as e:  # noqa: BLE001 - recorded, re-raised on every wait
            self.error = CheckpointError(self.final, f"saving failed ({type(e).__name__}: {e}); the previous "
                                                     "checkpoint stays the latest")
        finally:
            self.done = True
        failed = _from_rank0(self.error is not None)  # every rank learns whether rank 0 committed
        _barrier()
        if self.error is not None:
            raise self.error
        if failed:
            raise CheckpointError(self.final, "saving failed on rank 0; the previous checkpoint stays the latest")
        return self.final


def _commit(tmp: Path, final: Path, meta: dict[str, Any], latest: bool) -> None:
    files = sorted(p.name for p in tmp.iterdir())
    atomic_write_text(tmp / MARKER, json.dumps({**meta, "format": FORMAT, "files": files}, indent=1))
    fsync_dir(tmp)
    old = None
    if final.exists():  # the same name saved again: move the old one aside, then drop it
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if latest:
        point_latest(final)  # Note [latest pointer]
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save(state: dict[str, Any], path: str | os.PathLike, *, rank0_files: dict[str, Callable[[Path], Any]] | None = None,
         meta: dict[str, Any] | None = None, async_save: bool = False, latest: bool = True) -> PendingSave:
    """Write ``state`` (DTensors, tensors, plain values) as a DCP checkpoint directory ``path`` (collective).

    ``rank0_files``: ``{name: write(path)}`` run on rank 0 into the directory before the shards.
    ``async_save``: DCP stages a copy of the state and writes it in the background; the returned
    :class:`PendingSave` commits when waited on. A sync save is waited on before returning.
    """
    import torch.distributed.checkpoint as dcp  # loads in ~0.6 s: on use

    final = Path(path)
    if final.suffix == ".pt":
        raise ValueError(f"{final} names a file; a sharded checkpoint is a directory (drop the .pt suffix)")
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp = Path(_from_rank0(str(tmp)))  # one temporary name on every rank
    error = None
    if _rank() == 0:
        try:
            tmp.mkdir(parents=True)
            for name, write in (rank0_files or {}).items():
                write(tmp / name)
        except (OSError, TypeError, CheckpointError) as e:
            error = f"{type(e).__name__}: {e}"
    error = _from_rank0(error)
    if error is not None:
        raise CheckpointError(final, f"saving failed on rank 0 before the shards were written: {error}")
    full_meta = {"time": time.time(), "world_size": torch.distributed.get_world_size() if _dist() else 1,
                 "torch": str(torch.__version__), **(meta or {})}
    group = _ckpt_group()
    if async_save:
        # Note [stage only this rank's share]
        future = dcp.async_save(own_share(state, group), checkpoint_id=str(tmp), process_group=group)
        future = getattr(future, "upload_completion", future)
        return PendingSave(future, tmp, final, full_meta, latest)
    with _dcp_call():
        dcp.save(state, checkpoint_id=str(tmp), process_group=group)
    pending = PendingSave(None, tmp, final, full_meta, latest)
    pending.wait()
    return pending


def _plain_tensors(state: Any, path: tuple = ()):
    """``(path, tensor)`` for every plain (not DTensor) tensor reachable through dicts (not lists: DCP keys
    list entries by index, so dropping one would renumber the rest)."""
    if isinstance(state, dict):
        for k, v in state.items():
            yield from _plain_tensors(v, (*path, k))
    elif type(state) in (torch.Tensor, torch.nn.Parameter):
        yield path, state


def _without(state: dict, drop: set, path: tuple = ()) -> dict:
    """A copy of the dict tree ``state`` without the leaves at the paths in ``drop`` (tensors are not copied)."""
    out = {}
    for k, v in state.items():
        p = (*path, k)
        if p in drop:
            continue
        out[k] = _without(v, drop, p) if isinstance(v, dict) else v
    return out


def own_share(state: dict[str, Any], group: Any = None) -> dict[str, Any]:
    """``state`` without the replicated plain tensors another rank writes (collective; see the note below).

    # Note [stage only this rank's share]
    DCP treats a plain tensor that several ranks hold under the same key as one replicated tensor and
    writes it once (its planner drops the duplicates after planning). An async save stages (copies) its
    state before returning, so with a replicated model (DDP, stage 1's parameters) every rank would copy
    the whole model and optimizer only for most of it to be dropped. Deciding up front which rank writes
    each such tensor (the biggest first, to the holder with the fewest bytes so far; same key, shape and
    dtype on every holder, else it is left to DCP) makes each rank stage only what it writes: the
    checkpoint is the same, the stall shrinks with the world size. DTensor shards stay untouched.
    """
    if not _dist() or tdist.get_world_size(group) < 2:
        return state
    mine = {p: (tuple(t.shape), str(t.dtype), t.numel() * t.element_size()) for p, t in _plain_tensors(state)}
    every = [None] * tdist.get_world_size(group)
    tdist.all_gather_object(every, mine, group=group)
    holders: dict[tuple, list[int]] = {}
    for r, tensors in enumerate(every):
        for p in tensors:
            holders.setdefault(p, []).append(r)
    load = [0] * len(every)
    drop = set()
    for p in sorted(holders, key=lambda p: (-every[holders[p][0]][p][2], repr(p))):
        ranks = holders[p]
        if len(ranks) < 2 or len({every[r][p] for r in ranks}) > 1:
            continue  # held by one rank, or not the same tensor everywhere: DCP's own handling
        owner = min(ranks, key=lambda r: (load[r], r))
        load[owner] += every[owner][p][2]
        if owner != tdist.get_rank(group) and p in mine:
            drop.add(p)
    return _without(state, drop) if drop else state


def is_checkpoint_dir(path: str | os.PathLike) -> bool:
    """True when ``path`` is a committed DCP checkpoint directory (it holds the marker)."""
    return (Path(path) / MARKER).is_file()


def validate(path: str | os.PathLike) -> dict[str, Any]:
    """Check a checkpoint directory; returns its marker's content or raises ``CheckpointError`` naming the problem."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(path, "no such checkpoint directory")
    if path.name.startswith("."):
        raise CheckpointError(path, "is a temporary directory of a save that did not finish (torn); use a committed "
                                    "checkpoint")
    try:
        meta = json.loads((path / MARKER).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(path, f"lacks a readable {MARKER} ({e}): not a complete fleetlite checkpoint") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(path, f"{MARKER} is not a fleetlite sharded checkpoint marker")
    try:
        metadata = read_metadata(str(path))  # Note [safe DCP metadata]
    except Exception as e:  # noqa: BLE001 - DCP raises various types for a damaged .metadata
        raise CheckpointError(path, f"its DCP .metadata is missing or unreadable ({e})") from None
    wanted = {getattr(v, "relative_path", None) for v in (metadata.storage_data or {}).values()}
    wanted |= set(meta.get("files", []))
    missing = sorted(f for f in wanted if f and not (path / f).exists())
    if missing:
        raise CheckpointError(path, f"incomplete: missing shard file(s) {missing}; a rank's write was lost. Use "
                                    "an older checkpoint")
    return meta


def load(state: dict[str, Any], path: str | os.PathLike, subset: bool = False) -> dict[str, Any]:
    """Load a validated checkpoint directory into ``state`` in place (collective; reshards to ``state``'s layout).
    ``subset``: this rank's model is a part of the saved one (a pipeline stage): saved entries it lacks are fine."""
    import torch.distributed.checkpoint as dcp  # loads in ~0.6 s: on use

    meta = validate(path)
    if isinstance(state.get("model"), dict):
        _check_model_keys(path, state["model"], subset)
    try:
        with _dcp_call():
            dcp.load(state, checkpoint_id=str(path), storage_reader=SafeReader(str(path)), process_group=_ckpt_group())
    except Exception as e:  # noqa: BLE001 - DCP wraps per-rank errors in CheckpointException
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(path, f"does not fit this model/optimizer: {text}") from None
    return meta


def _saved(path: Path, key: str = "model") -> dict[str, Any]:
    """``{name: metadata}`` of the entries the directory ``path`` holds under ``key`` (names without the prefix)."""
    items = read_metadata(str(path)).state_dict_metadata.items()  # Note [safe DCP metadata]
    return {k[len(key) + 1:]: m for k, m in items if k.startswith(key + ".")}


def saved_keys(path: str | os.PathLike) -> list[str]:
    """Every entry the checkpoint directory ``path`` holds, by DCP's flattened key (``model.fc.weight``...)."""
    return list(read_metadata(str(path)).state_dict_metadata)  # Note [safe DCP metadata]


def _check_model_keys(path: Path, model_state: dict[str, Any], subset: bool = False) -> None:
    """A clear error naming missing/unexpected/reshaped weights before DCP starts (a foreign model's checkpoint)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    saved = _saved(path)
    missing = sorted(set(model_state) - set(saved))
    unexpected = [] if subset else sorted(set(saved) - set(model_state))
    reshaped = sorted(k for k, v in model_state.items() if k in saved and torch.is_tensor(v)
                      and isinstance(saved[k], TensorStorageMetadata) and tuple(saved[k].size) != tuple(v.shape))
    if missing or unexpected or reshaped:
        raise CheckpointError(path, f"was saved from another model: missing {missing[:10]}, unexpected "
                                    f"{unexpected[:10]}, different shapes {reshaped[:10]}")


def read_full(path: str | os.PathLike, model: torch.nn.Module | None = None, key: str = "model"
              ) -> dict[str, torch.Tensor]:
    """The full weights of the checkpoint directory ``path``, offline, on the CPU (``load_full``'s reader)."""
    import torch.distributed.checkpoint as dcp  # loads in ~0.6 s: on use
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = Path(path)
    validate(path)
    state = {f"{key}.{k}": torch.empty(m.size, dtype=m.properties.dtype) for k, m in _saved(path, key).items()
             if isinstance(m, TensorStorageMetadata)}
    if not state:
        raise CheckpointError(path, f"holds no '{key}' entries")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        with _dcp_call():
            dcp.load(state, checkpoint_id=str(path), storage_reader=SafeReader(str(path)), no_dist=True)
    weights = {k[len(key) + 1:]: v for k, v in state.items()}
    if model is not None:
        load_into(model, weights, path)
    return weights


def load_into(model: torch.nn.Module, weights: dict[str, Any], path: Any) -> None:
    """Load full ``weights`` into ``model`` strictly; a checkpoint of another model is a ``CheckpointError`` naming
    the missing and unexpected keys (``path``: the checkpoint, for the message)."""
    own = set(model.state_dict())
    missing, unexpected = sorted(own - set(weights)), sorted(set(weights) - own)
    if missing or unexpected:
        raise CheckpointError(path, f"does not fit {type(model).__name__}: missing {missing[:10]}, unexpected "
                                    f"{unexpected[:10]}")
    model.load_state_dict(weights, strict=True)
