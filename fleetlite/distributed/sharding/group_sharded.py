"""Paddle's ``paddle.distributed.sharding`` API: ``group_sharded_parallel`` and ``save_group_sharded_model``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from ...checkpoint import save_checkpoint
from ...parallel import WrappedModel
from ..fleet import context as fleet_context
from ..fleet import fleet as fleet_mod

__all__ = ["group_sharded_parallel", "save_group_sharded_model"]

_LEVELS = {"os": 1, "os_g": 2, "p_g_os": 3}


def group_sharded_parallel(model: nn.Module, optimizer: torch.optim.Optimizer, level: str,
                           scaler: torch.amp.GradScaler | None = None, group: Any = None, offload: bool = False,
                           sync_buffers: bool = False, buffer_max_size: int = 2 ** 23, segment_size: int = 2 ** 20,
                           sync_comm: bool = False, dp_group: Any = None, exclude_layer: Any = None,
                           sharding_degree: int | None = None, wrap: list[str] | None = None):
    """Shard ``model`` and ``optimizer`` at Paddle's ``level``; returns ``(model, optimizer, scaler)``.

    ``"os"``: optimizer state (stage 1, ``ZeroRedundancyOptimizer``, the model
    in ``fleetlite.DataParallel``); ``"os_g"``: + gradients (stage 2, FSDP2
    ``reshard_after_forward=False``); ``"p_g_os"``: + parameters (stage 3).
    ``offload`` keeps shards in CPU memory (stages 2/3). ``scaler`` becomes a
    rank-consistent ``fleet.distributed_scaler``. ``sharding_degree`` below the
    world size gives hybrid sharding. Paddle's buffer/segment sizes and
    ``sync_comm`` are tuning knobs of its own engine and are accepted and
    ignored; ``group``/``dp_group``/``exclude_layer`` are refused when given.

    Example::

        from fleetlite.distributed.sharding import group_sharded_parallel, save_group_sharded_model
        model, opt, scaler = group_sharded_parallel(net, torch.optim.AdamW(net.parameters()), level="p_g_os")
        ...
        save_group_sharded_model(model, "out/", optimizer=opt)
    """
    if level not in _LEVELS:
        raise ValueError(f"level={level!r} must be one of 'os' (optimizer state), 'os_g' (+ gradients) or 'p_g_os' "
                         "(+ parameters)")
    for name, value in (("group", group), ("dp_group", dp_group), ("exclude_layer", exclude_layer)):
        if value is not None:
            raise NotImplementedError(f"group_sharded_parallel({name}=...) is not supported; sharding runs over "
                                      "all ranks (or sharding_degree-sized groups for hybrid sharding)")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    strategy = fleet_mod.get_strategy()
    strategy.sharding = True
    strategy.sharding_configs = {"stage": _LEVELS[level], "offload": bool(offload), "wrap": list(wrap or []),
                                 "sharding_degree": -1 if sharding_degree is None else int(sharding_degree)}
    if fleet_mod.is_initialized():
        fleet_context.state.strategy = strategy
    else:
        fleet_mod.init(is_collective=True, strategy=strategy)
    model = fleet_mod.distributed_model(model)
    optimizer = fleet_mod.distributed_optimizer(optimizer)
    if scaler is not None:
        scaler = fleet_mod.distributed_scaler(scaler)
    return model, optimizer, scaler


def save_group_sharded_model(model: nn.Module, output: str | os.PathLike, optimizer: Any = None) -> None:
    """Save the full (unsharded) weights to ``output/model.pdmodel`` and, with ``optimizer``, its full state to
    ``output/model.pdopt`` (Paddle's file names; ``torch.save`` files). Collective: every rank calls it, rank 0
    writes, atomically."""
    output = Path(output)
    if output.suffix:
        raise ValueError(f"save_group_sharded_model(output={str(output)!r}) takes a directory, not a file name")
    full = model.full_state_dict(rank0_only=True) if isinstance(model, WrappedModel) else model.state_dict()
    opt_state = optimizer.state_dict() if optimizer is not None else None
    if tdist.is_initialized() and tdist.get_rank() != 0:
        tdist.barrier()
        return
    output.mkdir(parents=True, exist_ok=True)
    save_checkpoint({"model": dict(full)}, output / "model.pdmodel")
    if opt_state is not None:
        save_checkpoint({"optimizer": opt_state}, output / "model.pdopt")
    if tdist.is_initialized():
        tdist.barrier()
