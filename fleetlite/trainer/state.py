"""The Trainer's full training state: what a checkpoint holds and how it is put back.

Checkpoint entries (see :mod:`fleetlite.checkpoint` for the file format):

``model`` (unprefixed state_dict) · ``optimizer`` · ``scaler`` (amp) ·
``data`` (the training data's position) · ``progress`` (epoch, batch in
epoch, whether the epoch finished, global step: ``FitState.state_dict``) ·
``ranks`` (per rank: RNG states now and at the start of the epoch, partial
sums of the epoch's training loss and metrics: ``FitState.rank_state_dict``) ·
``world_size`` · ``callbacks`` (each callback's state; LR schedulers are
inside their ``LRScheduler``) · ``strategy`` · ``config`` · ``meta``.

A resume reads the file once (:func:`restore_for_fit`): the weights, the
optimizer, the data position and the progress go in at once, and the loop
gets a :class:`~fleetlite.trainer.fit_state.ResumePoint` for the rest.

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
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..checkpoint import (
    CheckpointError,
    LoadedCheckpoint,
    find_newest,
    is_checkpoint_dir,
    load_checkpoint,
    on_every_rank,
    read,
    save_checkpoint,
    validate,
    warn_if_overwriting,
)
from ..distributed import collective
from ..utils.user_warning import warn_user
from ..utils.weights import strip_compile_prefix
from .dcp_state import load_dcp_weights, write_dcp
from .fit_state import ResumePoint

__all__ = ["build_state", "save_dcp", "write_state", "save_trainer", "resolve_resume", "read_resume", "restore_for_fit",
           "rank_entry", "load_weights", "full_weights", "load_model_state", "check_optimizer", "warn_if_overwriting",
           "optimizer_name", "REQUIRED"]

REQUIRED = ("model", "progress", "ranks", "world_size", "callbacks")


def build_state(trainer, weights: bool = True, optimizer: bool = True) -> dict[str, Any] | None:
    """The whole training state; collective (every rank calls it), the dict is returned on rank 0 only.

    ``weights``/``optimizer`` False leave ``model``/``optimizer`` None (a sharded checkpoint holds them).
    """
    ranks = collective.all_gather_object(trainer.fit_state.rank_state_dict(trainer.metrics))
    optimizer = trainer.optimizer.state_dict() if optimizer and trainer.optimizer is not None else None  # collective
    model = model_state(trainer) if weights else None  # collective if sharded
    if collective.get_rank() != 0:
        return None
    amp = getattr(trainer.optimizer, "amp", None)
    state = {
        "model": model,
        "optimizer": optimizer,
        "scaler": amp.state_dict() if amp is not None and amp.uses_scaler else None,
        "data": trainer.fit_state.data_position(),
        "progress": trainer.fit_state.state_dict(),
        "ranks": ranks,
        "world_size": collective.get_world_size(),
        "callbacks": trainer.callbacks.state_dict() if trainer.callbacks is not None else {},
        "strategy": None if trainer.strategy is None else trainer.strategy.to_dict(),
        "config": trainer.config,
        "meta": {"time": time.time(), "torch": str(torch.__version__), "fleetlite": __version__,
                 "optimizer": optimizer_name(trainer.user_optimizer)},
    }
    return state


def model_state(trainer, rank0_only: bool = True) -> dict[str, Any]:
    """The model's full unprefixed state; collective for a sharded (stage 2/3) model (then gathered on rank 0
    only unless ``rank0_only=False``)."""
    net = trainer.parallel_network
    if hasattr(net, "full_state_dict"):
        return net.full_state_dict(rank0_only=rank0_only)
    return trainer.network.state_dict()


def full_weights(trainer) -> dict[str, torch.Tensor]:
    """A copy of the model's full unprefixed state on every rank (collective for a sharded model)."""
    weights = model_state(trainer, rank0_only=False)
    live = {(t.to_local() if hasattr(t, "to_local") else t).data_ptr()
            for t in trainer.network.state_dict().values() if torch.is_tensor(t)}
    # gathered shards are new tensors already; what still aliases the model (plain tensors, buffers) is copied
    return {k: v.detach().clone() if v.data_ptr() in live else v for k, v in weights.items()}


def load_model_state(trainer, weights: dict[str, Any], strict: bool = True) -> None:
    """Load a full state into the model (into the shards of a sharded model; every rank holds ``weights``)."""
    net = trainer.parallel_network
    (net if hasattr(net, "full_state_dict") else trainer.network).load_state_dict(weights, strict=strict)


def optimizer_name(optimizer: Any) -> str | None:
    """``"torch.optim.adam.Adam"``: the class of the torch optimizer that steps (inside any wrapper)."""
    if optimizer is None:
        return None
    inner = getattr(optimizer, "inner_opt", optimizer)
    return f"{type(inner).__module__}.{type(inner).__qualname__}"


def check_optimizer(path: str | Path, state: dict[str, Any], optimizer: Any, hint: str) -> None:
    """Refuse, naming both, a checkpoint whose optimizer state comes from another optimizer class.

    torch would load such a state silently and fail at the first step (``KeyError: 'momentum'``). Checkpoints
    that do not record the class are checked by their hyperparameter names.
    """
    saved_opt = state.get("optimizer")
    if optimizer is None or not isinstance(saved_opt, dict):
        return
    saved = (state.get("meta") or {}).get("optimizer")
    mine = optimizer_name(optimizer)

    def short(name: Any) -> str:
        return str(name).rsplit(".", 1)[-1]

    if saved is not None and saved != mine:
        raise CheckpointError(path, f"its optimizer state comes from {short(saved)} ({saved}) but this run's "
                                    f"optimizer is {short(mine)} ({mine}); {hint}")
    groups = saved_opt.get("param_groups") or []
    own = getattr(optimizer, "inner_opt", optimizer).param_groups
    if saved is None and groups and own:
        missing = sorted(set(own[0]) - set(groups[0]) - {"params"})
        if missing:
            raise CheckpointError(path, f"its optimizer state lacks the hyperparameters {missing} of this run's "
                                        f"optimizer {short(mine)} ({mine}): it was written by another optimizer "
                                        f"class; {hint}")


def save_dcp(trainer, path: str | Path, latest: bool = True, async_save: bool = False):
    """Write the training state as a DCP directory (collective); returns a :class:`fleetlite.checkpoint.PendingSave`.

    The Trainer's own entries go to ``trainer.pt`` (built here, as for a plain checkpoint); the model and
    optimizer shards are staged (copied) before this returns, so training may go on while an async save
    writes them.
    """
    if not trainer.at_step_boundary:
        raise RuntimeError("a checkpoint can only be written at an optimizer-step boundary")
    state = build_state(trainer, weights=False, optimizer=False)  # the shards hold both
    return write_dcp(trainer, path, state, latest=latest, async_save=async_save)


def write_state(trainer, path: str | Path, latest: bool = False) -> Path:
    """Build the state and write it on rank 0; every rank returns the path or raises the same error."""
    path = Path(path)
    state = build_state(trainer)
    error = None
    if state is not None:
        try:
            if latest:
                check_finite(state["model"], path)
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


def check_finite(weights: dict[str, Any], path: Path) -> None:
    """Refuse (``CheckpointError``) weights holding NaN/inf: such a checkpoint never replaces ``latest.pt``."""
    bad = [k for k, v in weights.items()
           if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(path, f"not written: non-finite weights (NaN/inf) in {bad[:5]}"
                                    f"{' ...' if len(bad) > 5 else ''}; training diverged, and latest.pt keeps "
                                    "pointing at the last finite checkpoint. Add fleetlite.callbacks.TerminateOnNaN "
                                    "to stop at the first non-finite loss; try a lower learning rate")


def save_trainer(trainer, path: str | Path, training: bool = True) -> Path:
    """``Trainer.save``: the full training state (collective), or with ``training=False`` the weights (rank 0)."""
    path = Path(path)
    if path.suffix == "":
        path = path.with_suffix(".pt")
    if training:
        if trainer.parallel_network is None:
            trainer.setup()
        return write_state(trainer, path)
    weights = model_state(trainer)
    if collective.get_rank() == 0:
        save_checkpoint({"model": weights, "config": trainer.config}, path)
    return path


def resolve_resume(resume: Any, directory: str | Path | None) -> Path | None:
    """The checkpoint file to resume from (decided on rank 0, the same on every rank) or None.

    ``resume``: None/False (fresh), a file path, a directory (its newest valid
    checkpoint), ``"latest"`` (the newest valid checkpoint of ``directory``,
    falling back with a warning; an error when there is none) or ``"auto"``
    (like ``"latest"`` but a fresh start when there is none), or a
    :class:`~fleetlite.trainer.checkpoint.LoadedCheckpoint` (a file the caller
    already read on every rank, kept as it is).
    """
    if resume is None or resume is False:
        return None
    if isinstance(resume, LoadedCheckpoint):  # already read (and agreed) by the caller: not read again
        return resume
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
        found = find_newest(directory, require=REQUIRED)
        if found is None and resume != "auto":
            raise CheckpointError(directory, "holds no valid checkpoint to resume from (resume='latest'); use "
                                             "resume='auto' to start fresh when there is none")
        return found
    p = Path(resume)
    if p.is_dir():
        if is_checkpoint_dir(p):
            validate(p)
            return p
        found = find_newest(p, require=REQUIRED)
        if found is None:
            raise CheckpointError(p, "holds no valid checkpoint to resume from")
        return found
    load_checkpoint(p, require=REQUIRED)  # a clear error now, before any work
    return p


def read_resume(path: Path) -> dict[str, Any]:
    """Read a resume checkpoint's entries (a file, or a checkpoint directory's trainer.pt) on every rank; all
    ranks fail together with the same message."""
    return on_every_rank(lambda: read(path, REQUIRED).state)


def rank_entry(state: dict[str, Any], rank: int, world_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(RNG entry, training partial sums) for ``rank``; on another world size all sums go to rank 0."""
    ranks = state["ranks"]
    saved_world = int(state["world_size"])
    if saved_world == world_size:
        entry = ranks[rank]
        return entry, entry["train_accum"]
    if rank == 0:
        warn_user(f"fleetlite: resuming a {saved_world}-rank checkpoint on {world_size} ranks: every remaining "
                      "sample of the epoch is still seen once, but random streams (and so results) differ from "
                      "an uninterrupted run")
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


def restore_for_fit(t, path: Path, train) -> ResumePoint:
    """Load ``path`` into trainer ``t`` before ``fit`` runs: model, optimizer, scaler, data position, progress.

    Callback states, RNG states and the epoch's partial sums are put back by
    the loop from the returned :class:`ResumePoint` (Note [resume order]).
    Raises ``CheckpointError`` naming the file when it does not fit the model or the run.
    """
    s = path.state if isinstance(path, LoadedCheckpoint) else read_resume(path)
    path = Path(path)
    world = collective.get_world_size()
    if s["world_size"] != world and not train.resumable and not s["progress"]["epoch_finished"]:
        raise CheckpointError(path, f"saved mid-epoch by {s['world_size']} ranks; resuming on {world} ranks needs "
                                    "training data with a DistributedBatchSampler (a Dataset, such a DataLoader or "
                                    "a TensorLoader)")
    if path.is_dir():  # a sharded checkpoint: model and optimizer through DCP (resharded to this run)
        load_dcp_weights(t, path)
    else:
        try:
            load_model_state(t, s["model"])
        except (RuntimeError, KeyError, ValueError) as e:
            raise CheckpointError(path, f"incompatible with this model: {e}") from None
    check_optimizer(path, s, t.user_optimizer, "resume with the optimizer it was trained with (recipes: the same "
                                                "optim=...), or start a new run from its weights with "
                                                "Trainer.load(path, reset_optimizer=True)")
    try:
        if s.get("optimizer") is not None and not path.is_dir():
            t.optimizer.load_state_dict(s["optimizer"])
        amp = getattr(t.optimizer, "amp", None)
        if s.get("scaler") and amp is not None:
            amp.load_state_dict(s["scaler"])
        if s.get("data") is not None:
            train.load_position(s["data"])
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(path, f"incompatible with this run: {e}") from None
    t.fit_state.load_state_dict(s["progress"])
    entry, sums = rank_entry(s, collective.get_rank(), world)
    return ResumePoint(epoch_finished=bool(s["progress"]["epoch_finished"]),
                       pass_done=bool(s["progress"].get("pass_done", False)), rng=entry["rng"],
                       epoch_rng=entry["epoch_rng"], sums=sums, callbacks=s["callbacks"])


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
    if not reset_optimizer:  # before anything is loaded
        check_optimizer(path, s, t.user_optimizer, "use reset_optimizer=True to load the weights only")
    weights = strip_compile_prefix(weights)  # a torch.compile-d module's state_dict loads too
    own = model_state(t, rank0_only=False) if skip_mismatch else {}  # (collective when sharded)
    if skip_mismatch:
        bad = [k for k, v in weights.items() if k not in own or tuple(own[k].shape) != tuple(v.shape)]
        if bad:
            warn_user(f"fleetlite: load skipped {len(bad)} mismatched entries from {path}: {bad[:10]}")
        own.update({k: v for k, v in weights.items() if k not in bad})
        weights = own
    try:
        load_model_state(t, weights)
    except RuntimeError as e:
        raise CheckpointError(path, f"incompatible with this model (use skip_mismatch=True to load what "
                                    f"matches): {e}") from None
    if not reset_optimizer and s.get("optimizer") is not None and t.user_optimizer is not None:
        t.setup()  # wraps the optimizer too; a loss is not needed to load
        try:
            t.optimizer.load_state_dict(s["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(path, f"its optimizer state does not fit this optimizer ({e}); use "
                                        "reset_optimizer=True to load the weights only") from None
