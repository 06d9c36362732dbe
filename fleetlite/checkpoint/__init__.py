"""Checkpoints, below the trainer: files, sharded (DCP) directories, finding the newest, RNG states.

* :mod:`.files`: one ``torch.save`` file, written atomically, CRC-checked and
  loaded with ``weights_only=True`` (``save_checkpoint``/``load_checkpoint``);
* :mod:`.dcp`: a sharded, reshardable, optionally asynchronous checkpoint
  directory on ``torch.distributed.checkpoint`` (``save``/``load``/``validate``);
* :mod:`.pointer`: the ``latest`` pointer of either kind (Note [latest pointer]);
* :mod:`.lookup`: one list, one newest-valid rule, one stale cleanup, the
  overwrite guard, read on every rank and fail together;
* :mod:`.rng`: the RNG states a bit-identical resume puts back.

What a Trainer checkpoint holds, and the order it is put back in, is the
Trainer's business (:mod:`fleetlite.trainer.checkpoint_connector`).

Example::

    import fleetlite.checkpoint as ckpt
    ckpt.save_checkpoint({"model": net.state_dict()}, "ckpt/step-00000010.pt", latest=True)
    found = ckpt.load_newest("ckpt")            # a LoadedCheckpoint (path, state) or None
    net.load_state_dict(found.state["model"])
"""

from __future__ import annotations

from .dcp import MARKER, RANK0_FILE, PendingSave, is_checkpoint_dir, load, own_share, read_full, save, validate
from .files import CheckpointError, LoadedCheckpoint, check_plain, load_checkpoint, probe_writable, save_checkpoint
from .lookup import (
    earlier_checkpoints,
    find_newest,
    list_checkpoints,
    load_full,
    load_newest,
    on_every_rank,
    read,
    remove_stale,
    resolve,
    warn_if_overwriting,
)
from .pointer import LATEST, LATEST_FILE, atomic_alias, point_latest
from .rng import capture_rng_state, restore_rng_state

__all__ = [
    "CheckpointError", "LoadedCheckpoint", "save_checkpoint", "load_checkpoint", "check_plain", "probe_writable",
    "MARKER", "RANK0_FILE", "PendingSave", "save", "own_share", "load", "load_full", "read_full", "validate",
    "is_checkpoint_dir", "LATEST", "LATEST_FILE", "point_latest", "atomic_alias", "list_checkpoints", "read",
    "find_newest", "load_newest", "resolve", "remove_stale", "earlier_checkpoints",
    "warn_if_overwriting", "on_every_rank", "capture_rng_state", "restore_rng_state",
]

