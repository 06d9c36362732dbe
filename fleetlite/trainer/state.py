"""The Trainer's full training state: what a checkpoint holds and how it is put back.

Checkpoint entries (see :mod:`fleetlite.trainer.checkpoint` for the file format):

``model`` (unprefixed state_dict) · ``optimizer`` · ``scaler`` (amp) ·
``data`` (the training data's position) · ``progress`` (epoch, batch in
epoch, whether the epoch finished, global step) · ``ranks`` (per rank: RNG
states now and at the start of the epoch, partial sums of the epoch's
training loss and metrics) · ``world_size`` · ``callbacks`` (each
callback's state; LR schedulers are inside their ``LRScheduler``) ·
``strategy`` · ``config`` · ``meta``.

# Note [resume order]
Bit-identical resume needs the same sequence of random draws as the
uninterrupted run. Creating a DataLoader iterator draws from the global torch
RNG, so on resume the epoch-start RNG states are restored first, the
iterator is created (and for loaders without a sampler cursor the consumed
batches are replayed, Note [resume replay]), and only then are the RNG
states of the saved step restored.

# Note [resume replay]
A loader without a DistributedBatchSampler has no position to save; it is
resumed by re-creating the epoch's iterator from the epoch-start RNG states
and skipping the batches already consumed. This is exact for deterministic
loaders (``num_workers=0``) at the same world size.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch

from .checkpoint import (
    CheckpointError,
    capture_rng_state,
    find_latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)

__all__ = ["build_state", "write_state", "save_trainer", "resolve_resume", "read_resume", "restore_for_fit",
           "load_weights", "REQUIRED"]

REQUIRED = ("model", "progress", "ranks", "world_size", "callbacks")


def _rank_state(trainer) -> dict[str, Any]:
    acc = trainer._train_accum
    return {"rng": capture_rng_state(), "epoch_rng": trainer._epoch_rng,
            "train_accum": {"loss_sum": float(acc["loss_sum"]), "count": int(acc["count"]),
                            "metrics": [m.state_dict() for m in trainer.metrics]}}


def build_state(trainer) -> dict[str, Any] | None:
    """The whole training state; collective (every rank calls it), the dict is returned on rank 0 only."""
    from ..distributed import collective

    ranks = collective.all_gather_object(_rank_state(trainer))
    optimizer = trainer.optimizer.state_dict() if trainer.optimizer is not None else None  # collective if sharded
    if collective.get_rank() != 0:
        return None
    data = trainer._data_position()
    amp = getattr(trainer.optimizer, "amp", None)
    state = {
        "model": trainer.network.state_dict(),
        "optimizer": optimizer,
        "scaler": amp.state_dict() if amp is not None and amp.uses_scaler else None,
        "data": data,
        "progress": {"epoch": trainer.epoch, "batch_in_epoch": trainer.batch_in_epoch,
                     "epoch_finished": trainer.epoch_finished, "pass_done": trainer._pass_done(),
                     "global_step": trainer.global_step,
                     "accumulate_grad_batches": trainer._accumulate},
        "ranks": ranks,
        "world_size": collective.get_world_size(),
        "callbacks": trainer._callbacks.state_dict() if trainer._callbacks is not None else {},
        "strategy": trainer._connector.strategy_dict(),
        "config": trainer.config,
        "meta": {"time": time.time(), "torch": str(torch.__version__), "fleetlite": _version()},
    }
    return state


def _version() -> str:
    from .. import __version__

    return __version__


def write_state(trainer, path: str | Path, latest: bool = False) -> Path:
    """Build the state and write it on rank 0; every rank returns the path or raises the same error."""
    from ..distributed import collective

    path = Path(path)
    state = build_state(trainer)
    error = None
    if state is not None:
        try:
            save_checkpoint(state, path, latest=latest)
        except CheckpointError as e:
            error = e.problem
        except TypeError as e:
            error = f"TypeError: {e}"
    if collective.is_initialized():
        error = collective.all_gather_object(error)[0]
    if error is not None:
        raise CheckpointError(path, f"saving failed on rank 0: {error}")
    return path


def save_trainer(trainer, path: str | Path, training: bool = True) -> Path:
    """``Trainer.save``: the full training state (collective), or with ``training=False`` the weights (rank 0)."""
    from ..distributed import collective

    path = Path(path)
    if path.suffix == "":
        path = path.with_suffix(".pt")
    if training:
        if trainer.parallel_network is None:
            trainer._prepare(training=False)
        return write_state(trainer, path)
    if collective.get_rank() == 0:
        save_checkpoint({"model": trainer.network.state_dict(), "config": trainer.config}, path)
    return path


def resolve_resume(resume: Any, directory: str | Path | None) -> Path | None:
    """The checkpoint file to resume from (decided on rank 0, the same on every rank) or None.

    ``resume``: None/False (fresh), a file path, a directory (its newest valid
    checkpoint), ``"latest"`` (the newest valid checkpoint of ``directory``,
    falling back with a warning; an error when there is none) or ``"auto"``
    (like ``"latest"`` but a fresh start when there is none).
    """
    from ..distributed import collective

    if resume is None or resume is False:
        return None
    choice: str | None = None
    error: str | None = None
    if collective.get_rank() == 0:
        try:
            p = _resolve_local(resume, directory)
            choice = None if p is None else str(p)
        except (CheckpointError, ValueError) as e:
            error = str(e)
    if collective.is_initialized():
        choice, error = collective.all_gather_object((choice, error))[0]
    if error is not None:
        raise CheckpointError(None, error)
    return None if choice is None else Path(choice)


def _resolve_local(resume: Any, directory: str | Path | None) -> Path | None:
    if resume in ("latest", "auto") or resume is True:
        if directory is None:
            raise ValueError(f"resume={resume!r} needs a checkpoint directory: pass fit(..., save_dir=...) or a "
                             "ModelCheckpoint(save_dir=...)")
        found = find_latest_checkpoint(directory, require=REQUIRED)
        if found is None and resume != "auto":
            raise CheckpointError(directory, "holds no valid checkpoint to resume from (resume='latest'); use "
                                             "resume='auto' to start fresh when there is none")
        return found
    p = Path(resume)
    if p.is_dir():
        found = find_latest_checkpoint(p, require=REQUIRED)
        if found is None:
            raise CheckpointError(p, "holds no valid checkpoint to resume from")
        return found
    load_checkpoint(p, require=REQUIRED)  # a clear error now, before any work
    return p


def read_resume(path: Path) -> dict[str, Any]:
    """Load a resume checkpoint on every rank; all ranks fail together with the same message."""
    from ..distributed import collective

    state, error = None, None
    try:
        state = load_checkpoint(path, require=REQUIRED)
    except CheckpointError as e:
        error = str(e)
    if collective.is_initialized():
        errors = [e for e in collective.all_gather_object(error) if e is not None]
        error = errors[0] if errors else None
    if error is not None:
        raise CheckpointError(None, error)
    return state


def rank_entry(state: dict[str, Any], rank: int, world_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(RNG entry, training partial sums) for ``rank``; on another world size all sums go to rank 0."""
    ranks = state["ranks"]
    saved_world = int(state["world_size"])
    if saved_world == world_size:
        entry = ranks[rank]
        return entry, entry["train_accum"]
    if rank == 0:
        warnings.warn(f"fleetlite: resuming a {saved_world}-rank checkpoint on {world_size} ranks: every remaining "
                      "sample of the epoch is still seen once, but random streams (and so results) differ from "
                      "an uninterrupted run", stacklevel=3)
    entry = ranks[rank % saved_world]
    if rank != 0:
        return entry, {"loss_sum": 0.0, "count": 0, "metrics": None}
    total = {"loss_sum": sum(r["train_accum"]["loss_sum"] for r in ranks),
             "count": sum(r["train_accum"]["count"] for r in ranks), "metrics": None}
    metric_states = [r["train_accum"]["metrics"] for r in ranks]
    if metric_states and metric_states[0]:
        total["metrics"] = [{k: sum(ms[i][k] for ms in metric_states) for k in metric_states[0][i]}
                            for i in range(len(metric_states[0]))]
    return entry, total


def restore_rng(entry: dict[str, Any] | None) -> None:
    if entry is not None:
        restore_rng_state(entry)


def restore_for_fit(t, path: Path, train) -> dict[str, Any]:
    """Load ``path`` into trainer ``t`` before ``fit`` runs: model, optimizer, scaler, data position, progress.

    Callback states, RNG states and the epoch's partial sums are put back by
    the loop (Note [resume order]). Raises ``CheckpointError`` naming the file
    when it does not fit the model or the run.
    """
    s = read_resume(path)
    world = t._connector.world_size
    if s["world_size"] != world and not train.resumable and not s["progress"]["epoch_finished"]:
        raise CheckpointError(path, f"saved mid-epoch by {s['world_size']} ranks; resuming on {world} ranks needs "
                                    "training data with a DistributedBatchSampler (a Dataset, such a DataLoader or "
                                    "a TensorLoader)")
    try:
        t.network.load_state_dict(s["model"], strict=True)
    except RuntimeError as e:
        raise CheckpointError(path, f"incompatible with this model: {e}") from None
    try:
        if s.get("optimizer") is not None:
            t.optimizer.load_state_dict(s["optimizer"])
        amp = getattr(t.optimizer, "amp", None)
        if s.get("scaler") and amp is not None:
            amp.load_state_dict(s["scaler"])
        if s.get("data") is not None:
            train.load_position(s["data"])
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(path, f"incompatible with this run: {e}") from None
    p = s["progress"]
    t.epoch, t.global_step = int(p["epoch"]), int(p["global_step"])
    t.batch_in_epoch, t.epoch_finished = int(p["batch_in_epoch"]), bool(p["epoch_finished"])
    return s


def load_weights(t, path: str | Path, skip_mismatch: bool = False, reset_optimizer: bool = False) -> None:
    """``Trainer.load``: weights from a checkpoint or a plain state_dict file, then the optimizer state."""
    path = Path(path)
    if path.suffix == "" and not path.exists() and path.with_suffix(".pt").exists():
        path = path.with_suffix(".pt")
    try:
        s = load_checkpoint(path)
        weights = s["model"]
    except CheckpointError as e:
        if "not a fleetlite checkpoint" not in e.problem:
            raise
        s, weights = {}, torch.load(path, map_location="cpu", weights_only=True)  # a plain state_dict file
        if not isinstance(weights, dict):
            raise
    from .connector import strip_compile_prefix

    weights = strip_compile_prefix(weights)  # a torch.compile-d module's state_dict loads too
    own = t.network.state_dict()
    if skip_mismatch:
        bad = [k for k, v in weights.items() if k not in own or tuple(own[k].shape) != tuple(v.shape)]
        if bad:
            warnings.warn(f"fleetlite: load skipped {len(bad)} mismatched entries from {path}: {bad[:10]}",
                          stacklevel=3)
        own.update({k: v for k, v in weights.items() if k not in bad})
        weights = own
    try:
        t.network.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        raise CheckpointError(path, f"incompatible with this model (use skip_mismatch=True to load what "
                                    f"matches): {e}") from None
    if not reset_optimizer and s.get("optimizer") is not None and t.user_optimizer is not None:
        t._prepare(training=False)  # wraps the optimizer too; a loss is not needed to load
        try:
            t.optimizer.load_state_dict(s["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(path, f"its optimizer state does not fit this optimizer ({e}); use "
                                        "reset_optimizer=True to load the weights only") from None
