"""``TensorParallel``: what ``fleet.distributed_model`` returns when ``hybrid_configs['mp_degree'] > 1``.

Example::

    s = fleet.DistributedStrategy(); s.hybrid_configs = {"dp_degree": 2, "mp_degree": 2}
    fleet.init(is_collective=True, strategy=s)
    model = fleet.distributed_model(MyTensorParallelModel())   # a TensorParallel
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters()))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from ....parallel import DataParallel
from ....parallel.comm import broadcast_coalesced
from . import hybrid_state
from .mp_layers import is_split

__all__ = ["TensorParallel"]


class TensorParallel(DataParallel):
    """A tensor-parallel model, data-parallel across the HybridCommunicateGroup's dp group (Paddle's class).

    At construction the replicated parameters and buffers (those without ``split_axis``: Note
    [tensor-parallel parameters]) are broadcast from the mp group's first rank, so every mp rank starts
    from the same ones; then the model is wrapped by fleetlite's data-parallel engine over the dp group
    (every parameter broadcast from the dp group's first rank, gradients averaged across the dp group in
    buckets during backward, ``no_sync`` and gradient merge as with ``DataParallel``). ``state_dict`` holds
    this rank's slices under the module's own keys (Paddle's per-mp-rank files); for a reshardable
    checkpoint see :func:`~fleetlite.distributed.fleet.meta_parallel.sharded_state_dict`.

    Example::

        model = TensorParallel(mlp, fleet.get_hybrid_communicate_group())
    """

    def __init__(self, layers: nn.Module, hcg: Any, strategy: Any = None, **dp_kwargs: Any) -> None:
        if not isinstance(layers, nn.Module):
            raise TypeError(f"TensorParallel needs a torch.nn.Module, got {type(layers).__name__}")
        mp_group = hcg.get_model_parallel_group()
        if mp_group is not None and hcg.get_model_parallel_world_size() > 1:
            replicated = [p for p in layers.parameters() if not is_split(p)] + list(layers.buffers())
            broadcast_coalesced([t.data for t in replicated], mp_group)
        super().__init__(layers, group=hcg.get_data_sharding_parallel_group(), **dp_kwargs)  # dp × sharding
        self._hcg = hcg
        self._strategy = strategy

    # -- the WrappedModel protocol's full weights (Note [hybrid full state]) --------------------------------------
    @property
    def is_sharded(self) -> bool:
        """True with mp > 1: the full weights are gathered from the mp group's slices (collective)."""
        return self._hcg.get_model_parallel_world_size() > 1

    def full_state_dict(self, rank0_only: bool = False) -> dict[str, torch.Tensor]:
        """The single-process model's state: every slice gathered over the mp group (collective)."""
        return hybrid_state.full_state_dict(self._layers, rank0_only=rank0_only)

    def load_full_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Load the single-process model's state: each rank keeps its slices."""
        return hybrid_state.load_full_state_dict(self._layers, state_dict, strict=strict)
