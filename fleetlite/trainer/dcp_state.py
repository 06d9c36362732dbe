"""The Trainer's state as a sharded (DCP) checkpoint directory: see :mod:`fleetlite.checkpoint`.

The model and optimizer go through ``torch.distributed.checkpoint`` (each
rank writes its shards; names are the plain module's parameter names, so
any world size or stage loads them); everything else the Trainer
checkpoints (:mod:`fleetlite.trainer.state`: data position, progress, RNG
per rank, callbacks...) goes into ``trainer.pt`` inside the directory,
written by rank 0.

# Note [stage 1 in DCP]
Stage 1's ``ZeroRedundancyOptimizer`` is unknown to DCP, but each rank's
partition is a plain torch optimizer over a subset of the parameters
(``zero.optim``). Its state goes into the checkpoint in the same FQN-keyed
format as any other optimizer's (``get_optimizer_state_dict``), with the
global parameter groups, so each rank writes only its own partition's state
(no consolidation on rank 0) and the checkpoint loads into any world size
or stage like a DDP one.
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

from .. import checkpoint as ckpt
from ..parallel.sharded.rebuild import groups_kept

__all__ = ["write_dcp", "load_dcp_weights"]


def _module(trainer):
    net = trainer.parallel_network
    return net.module if net is not None and hasattr(net, "module") else trainer.network


def _zero(trainer):
    """Stage 1's ``ZeroRedundancyOptimizer``, or None."""
    inner = getattr(trainer.optimizer, "inner_opt", trainer.optimizer)
    return inner if hasattr(inner, "consolidate_state_dict") else None


def _optimizer(trainer):
    """The torch optimizer DCP describes (stage 1: this rank's partition, Note [stage 1 in DCP]), or None."""
    opt = trainer.optimizer
    if opt is None:
        return None
    zero = _zero(trainer)
    return zero.optim if zero is not None else getattr(opt, "inner_opt", opt)


def _global_groups(module, zero, local_groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The local partition's FQN-keyed param groups with every rank's parameters and the global hyperparameters
    (an LR schedule sets them on the ZeroRedundancyOptimizer; its partition sees them at the next step)."""
    names = {id(p): n for n, p in module.named_parameters(remove_duplicate=False)}
    return [{**lg, **{k: v for k, v in g.items() if k != "params" and k in lg},
             "params": [names[id(p)] for p in g["params"]]} for lg, g in zip(local_groups, zero.param_groups)]


def _app_state(trainer) -> dict[str, Any]:
    module = _module(trainer)
    state = {"model": get_model_state_dict(module)}
    opt = _optimizer(trainer)
    if opt is not None:
        state["optim"] = get_optimizer_state_dict(module, opt)
        zero = _zero(trainer)
        if zero is not None:
            state["optim"]["param_groups"] = _global_groups(module, zero, state["optim"]["param_groups"])
    return state


def _load_partition(module, zero, optim_state: dict[str, Any]) -> None:
    """Load an FQN-keyed full optimizer state into stage 1's partition and its global hyperparameters."""
    names = {id(p): n for n, p in module.named_parameters(remove_duplicate=False)}
    local = zero.optim
    index, groups = 0, []
    state: dict[int, Any] = {}
    for lg, loaded in zip(local.param_groups, optim_state["param_groups"]):
        ids = []
        for p in lg["params"]:
            if names[id(p)] in optim_state["state"]:
                state[index] = optim_state["state"][names[id(p)]]
            ids.append(index)
            index += 1
        groups.append({**{k: v for k, v in loaded.items() if k != "params"}, "params": ids})
    local.load_state_dict({"state": state, "param_groups": groups})
    for g, loaded in zip(zero.param_groups, optim_state["param_groups"]):
        g.update({k: v for k, v in loaded.items() if k != "params" and k in g})


def write_dcp(trainer, path: str | Path, trainer_state: dict[str, Any] | None, latest: bool = True,
              async_save: bool = False):
    """Write the model/optimizer shards and ``trainer_state`` (as ``trainer.pt``) as a DCP directory (collective).

    Returns a :class:`fleetlite.checkpoint.PendingSave`; the shards are staged (copied) before this returns,
    so training may go on while an async save writes them. ``trainer_state`` comes from
    :meth:`~fleetlite.trainer.checkpoint_connector.CheckpointConnector.save_sharded`, which is what callers use.
    """
    files = {} if trainer_state is None else {ckpt.RANK0_FILE: lambda p: ckpt.save_checkpoint(trainer_state, p)}
    meta = {"global_step": trainer.global_step, "epoch": trainer.epoch,
            "stage": trainer.strategy.sharding_stage if trainer.strategy is not None else 0}
    return ckpt.save(_app_state(trainer), path, rank0_files=files, meta=meta, async_save=async_save,
                         latest=latest)


def load_dcp_weights(trainer, path: Path, optimizer: bool = True) -> None:
    """Load the model (and, with ``optimizer``, the optimizer) shards of ``path`` into the trainer (collective)."""
    app = _app_state(trainer)
    if not optimizer:
        app.pop("optim", None)
    ckpt.load(app, path)
    module = _module(trainer)
    set_model_state_dict(module, app["model"])
    if "optim" in app and _zero(trainer) is not None:
        _load_partition(module, _zero(trainer), app["optim"])
    elif "optim" in app:
        with groups_kept(_optimizer(trainer)):  # Note [shared parameter groups]
            set_optimizer_state_dict(module, _optimizer(trainer), app["optim"])
