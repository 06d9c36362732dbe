"""The Trainer's state as a sharded (DCP) checkpoint directory: see :mod:`fleetlite.checkpoint`.

The model and optimizer go through ``torch.distributed.checkpoint`` (each
rank writes its shards; names are the plain module's parameter names, so
any world size or stage loads them); everything else the Trainer
checkpoints (:mod:`fleetlite.trainer.state`: data position, progress, RNG
per rank, callbacks...) goes into ``trainer.pt`` inside the directory,
written by rank 0. Stage 1's optimizer (``ZeroRedundancyOptimizer``, which
DCP does not know) is consolidated into ``trainer.pt`` as in a ``.pt``
checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from .. import checkpoint as dcp_ckpt  # (a module import: fleetlite.checkpoint imports trainer.checkpoint)
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint

__all__ = ["keeps_optimizer", "write_dcp", "read_dcp_state", "load_dcp_weights", "TRAINER_FILE"]

TRAINER_FILE = "trainer.pt"


def _module(trainer):
    net = trainer.parallel_network
    return net.module if net is not None and hasattr(net, "module") else trainer.network


def _optimizer(trainer):
    """The torch optimizer DCP can describe, or None (no optimizer, or stage 1's consolidated one)."""
    opt = trainer.optimizer
    if opt is None:
        return None
    inner = getattr(opt, "inner_opt", opt)
    return None if hasattr(inner, "consolidate_state_dict") else inner


def _app_state(trainer) -> dict[str, Any]:
    module = _module(trainer)
    state = {"model": get_model_state_dict(module)}
    opt = _optimizer(trainer)
    if opt is not None:
        state["optim"] = get_optimizer_state_dict(module, opt)
    return state


def keeps_optimizer(trainer) -> bool:
    """Whether ``trainer.pt`` must carry the optimizer (stage 1's consolidated one, which DCP cannot shard)."""
    return trainer.optimizer is not None and _optimizer(trainer) is None


def write_dcp(trainer, path: str | Path, trainer_state: dict[str, Any] | None, latest: bool = True,
              async_save: bool = False):
    """Write the model/optimizer shards and ``trainer_state`` (as ``trainer.pt``) as a DCP directory (collective).

    Returns a :class:`fleetlite.checkpoint.PendingSave`; the shards are staged (copied) before this returns,
    so training may go on while an async save writes them. ``trainer_state`` comes from
    :func:`fleetlite.trainer.state.save_dcp`, which is what callers use.
    """
    files = {} if trainer_state is None else {TRAINER_FILE: lambda p: save_checkpoint(trainer_state, p)}
    meta = {"global_step": trainer.global_step, "epoch": trainer.epoch,
            "stage": trainer.strategy.sharding_stage if trainer.strategy is not None else 0}
    return dcp_ckpt.save(_app_state(trainer), path, rank0_files=files, meta=meta, async_save=async_save,
                         latest=latest)


def read_dcp_state(path: Path, require) -> dict[str, Any]:
    """The Trainer entries (``trainer.pt``) of a validated checkpoint directory."""
    dcp_ckpt.validate(path)
    return load_checkpoint(path / TRAINER_FILE, require=require)


def load_dcp_weights(trainer, path: Path, state: dict[str, Any]) -> None:
    """Load the model (and optimizer) shards of ``path`` into the trainer's model and optimizer (collective)."""
    app = _app_state(trainer)
    consolidated = state.get("optimizer")  # a stage-1 run's optimizer, in trainer.pt (index-keyed, torch's format)
    if consolidated is not None or trainer.optimizer is None:
        app.pop("optim", None)
    dcp_ckpt.load(app, path)
    module = _module(trainer)
    set_model_state_dict(module, app["model"])
    if "optim" in app:
        set_optimizer_state_dict(module, _optimizer(trainer), app["optim"])
    elif consolidated is not None and trainer.optimizer is not None:
        try:
            trainer.optimizer.load_state_dict(consolidated)
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(path, f"its optimizer state does not fit this optimizer: {e}") from None
