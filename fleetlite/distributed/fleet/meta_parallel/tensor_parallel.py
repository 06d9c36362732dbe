"""``TensorParallel``: what ``fleet.distributed_model`` returns when ``hybrid_configs['mp_degree'] > 1``.

Example::

    s = fleet.DistributedStrategy(); s.hybrid_configs = {"dp_degree": 2, "mp_degree": 2}
    fleet.init(is_collective=True, strategy=s)
    model = fleet.distributed_model(MyTensorParallelModel())   # a TensorParallel
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters()))
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from ....parallel import DataParallel
from ....parallel.comm import broadcast_coalesced
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
