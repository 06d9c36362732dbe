"""Paddle's ``paddle.distributed.sharding`` API: ``group_sharded_parallel`` and ``save_group_sharded_model``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from ...parallel import WrappedModel
from ...utils.atomic import atomic_open
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
    ignored. ``group``: the hybrid communicate group's sharding group
    (``hcg.get_sharding_parallel_group()``, after ``fleet.init`` with ``hybrid_configs``' ``sharding_degree``),
    which shards over that axis next to tensor parallelism (``"p_g_os"``: FSDP2 over dp × sharding, Note
    [stage 3 beside mp]); another group, ``dp_group`` and ``exclude_layer`` are refused.

    Example::

        from fleetlite.distributed.sharding import group_sharded_parallel, save_group_sharded_model
        model, opt, scaler = group_sharded_parallel(net, torch.optim.AdamW(net.parameters()), level="p_g_os")
        ...
        save_group_sharded_model(model, "out/", optimizer=opt)
    """
    if level not in _LEVELS:
        raise ValueError(f"level={level!r} must be one of 'os' (optimizer state), 'os_g' (+ gradients) or 'p_g_os' "
                         "(+ parameters)")
    for name, value in (("dp_group", dp_group), ("exclude_layer", exclude_layer)):
        if value is not None:
            raise NotImplementedError(f"group_sharded_parallel({name}=...) is not supported; sharding runs over "
                                      "all ranks (or sharding_degree-sized groups for hybrid sharding)")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    hybrid_degree = _hcg_sharding_degree(group) if group is not None else None
    strategy = fleet_mod.get_strategy()
    strategy.sharding = True
    degree = hybrid_degree or (-1 if sharding_degree is None else int(sharding_degree))
    strategy.sharding_configs = {"stage": _LEVELS[level], "offload": bool(offload), "wrap": list(wrap or []),
                                 "sharding_degree": degree}
    if fleet_mod.is_initialized():
        fleet_context.state.strategy = strategy
    else:
        fleet_mod.init(is_collective=True, strategy=strategy)
    model = fleet_mod.distributed_model(model)
    optimizer = fleet_mod.distributed_optimizer(optimizer)
    if scaler is not None:
        scaler = fleet_mod.distributed_scaler(scaler)
    return model, optimizer, scaler


def _hcg_sharding_degree(group: Any) -> int:
    """The sharding degree of ``group`` when it is the hybrid communicate group's sharding group (the same ranks),
    else one line saying which group works."""
    hcg = fleet_context.state.hcg if fleet_mod.is_initialized() else None
    mine = hcg.get_sharding_parallel_group() if hcg is not None else None
    if mine is None or tdist.get_process_group_ranks(group) != tdist.get_process_group_ranks(mine):
        raise NotImplementedError(
            "group_sharded_parallel(group=...) takes the hybrid communicate group's sharding group only: call "
            "fleet.init with strategy.hybrid_configs' sharding_degree (e.g. {'mp_degree': 2, 'sharding_degree': 2}) "
            "and pass group=fleet.get_hybrid_communicate_group().get_sharding_parallel_group(), or leave group out "
            "(all ranks)")
    return hcg.get_sharding_parallel_world_size()


def save_group_sharded_model(model: nn.Module, output: str | os.PathLike, optimizer: Any = None) -> None:
    """Save the full (unsharded) weights to ``output/model.pdmodel`` and, with ``optimizer``, its full state to
    ``output/model.pdopt``: plain state dicts (``torch.save``), as Paddle's ``paddle.save(model.state_dict())``
    writes them, so Paddle's reload idiom works: ``net.load_state_dict(torch.load("out/model.pdmodel"))`` and
    ``opt.load_state_dict(torch.load("out/model.pdopt"))`` (``weights_only=True`` is enough). Collective: every
    rank calls it (the sharded state is gathered), rank 0 writes, each file atomically (a temporary file renamed
    into place: an interrupted save leaves the previous file whole)."""
    output = Path(output)
    if output.suffix or output.is_file():
        raise ValueError(f"save_group_sharded_model(output={str(output)!r}) takes a directory, not a file name")
    full = model.full_state_dict(rank0_only=True) if isinstance(model, WrappedModel) else model.state_dict()
    opt_state = optimizer.state_dict() if optimizer is not None else None  # collective under sharding
    error = None
    if not tdist.is_initialized() or tdist.get_rank() == 0:
        try:
            output.mkdir(parents=True, exist_ok=True)
            for name, state in (("model.pdmodel", dict(full)), ("model.pdopt", opt_state)):
                if state is not None:
                    with atomic_open(output / name, "wb") as f:
                        torch.save(state, f)
        except OSError as e:
            error = f"rank 0 could not write {output}/model.pdmodel/.pdopt: {e}; choose a writable directory"
    if tdist.is_initialized() and tdist.get_world_size() > 1:  # also the barrier: the files exist on return
        errors: list[Any] = [None] * tdist.get_world_size()
        tdist.all_gather_object(errors, error)
        error = errors[0]
    if error is not None:
        raise OSError(error)
