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
from ....utils.user_warning import warn_once
from . import hybrid_state
from .hybrid_sharding import ShardedGradients, wants_sharded_gradients
from .mp_layers import is_split
from .segment_parallel import check_segment_parallel

__all__ = ["TensorParallel"]


class TensorParallel(DataParallel):
    """A tensor-parallel model, data-parallel across the HybridCommunicateGroup's dp group (Paddle's class).

    A model without tensor-parallel layers is replicated over the mp group (each mp rank repeats the same
    work), with a warning, once per process. At construction the replicated parameters and buffers (those
    without ``split_axis``: Note
    [tensor-parallel parameters]) are broadcast from the mp group's first rank, so every mp rank starts
    from the same ones; then the model is wrapped by fleetlite's data-parallel engine over the dp group
    (every parameter broadcast from the dp group's first rank, gradients averaged across the dp group in
    buckets during backward, ``no_sync`` and gradient merge as with ``DataParallel``). ``state_dict`` holds
    this rank's slices under the module's own keys (Paddle's per-mp-rank files); for a reshardable
    checkpoint see :func:`~fleetlite.distributed.fleet.meta_parallel.sharded_state_dict`. With sharding stage 2
    (``strategy.sharding_configs['stage'] == 2``) the engine's buckets are not used: at the end of a synced
    backward each gradient is reduced to the sharding rank whose optimizer partition owns it and freed on the
    others (``sharded_grads``: Note [hybrid sharding stage 2]). Beside segment parallelism (``sep_degree > 1``)
    the engine runs over dp × sep instead (``hcg.get_dp_sep_parallel_group()``): each sep rank's gradient comes
    from its part of the sequence, and their mean is the full sequence's (Note [segment parallelism]).

    Example::

        model = TensorParallel(mlp, fleet.get_hybrid_communicate_group())
    """

    def __init__(self, layers: nn.Module, hcg: Any, strategy: Any = None, **dp_kwargs: Any) -> None:
        if not isinstance(layers, nn.Module):
            raise TypeError(f"TensorParallel needs a torch.nn.Module, got {type(layers).__name__}")
        mp = hcg.get_model_parallel_world_size()
        if mp > 1:  # the replicated parameters agreed over mp, with a warning if that is all of them
            params = list(layers.parameters())
            replicated = [p for p in params if not is_split(p)]
            if len(replicated) == len(params):
                warn_once("tensor-parallel-without-slices",
                          f"fleetlite: mp_degree={mp} but {type(layers).__name__} has no tensor-parallel layers "
                          "(ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding): it is replicated over "
                          f"the model-parallel group, whose {mp} ranks repeat the same work (as Paddle's "
                          "TensorParallel replicates such layers); use those layers, or give the ranks to dp_degree "
                          "instead")
            broadcast_coalesced([t.data for t in replicated + list(layers.buffers())], hcg.get_model_parallel_group())
        sep = hcg.get_sep_parallel_world_size()
        if sep > 1:  # Note [segment parallelism]: sep splits each sample's sequence, so it averages like dp
            check_segment_parallel(hcg)
        self._grad_stage2 = wants_sharded_gradients(hcg, strategy)  # read by _build_reducer in super().__init__
        group = hcg.get_dp_sep_parallel_group() if sep > 1 else hcg.get_data_sharding_parallel_group()
        super().__init__(layers, group=group, **dp_kwargs)  # dp × sharding, or dp × sep beside segment parallelism
        self._hcg = hcg
        self._strategy = strategy
        #: stage 2: the reduction to the gradients' owners (None: the engine averages every gradient)
        self.sharded_grads = ShardedGradients(self._layers.parameters(), hcg) if self._grad_stage2 else None

    def _build_reducer(self) -> None:
        if not self._grad_stage2:
            super()._build_reducer()
            return
        # Note [hybrid sharding stage 2]: a reducer of one rank plans the buckets but allocates no buffer and hooks
        # no parameter, so gradients stay autograd's tensors until ShardedGradients reduces and frees them
        world, self.world_size = self.world_size, 1
        try:
            super()._build_reducer()
        finally:
            self.world_size = world

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self.sharded_grads is None or self.world_size == 1:
            return super().forward(*inputs, **kwargs)
        sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if self.will_sync_module_buffers():  # Note [buffer sync]
            broadcast_coalesced(self._sync_buffers_list(), self.group)
        out = self._layers(*inputs, **kwargs)
        self.require_forward_param_sync = sync
        if sync:
            self.sharded_grads.arm(out)
        return out

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

    def state_layout(self) -> Any:
        """How this rank's state sits in the full model's (the ``WrappedModel`` protocol; Note [hybrid full state])."""
        return hybrid_state.state_layout(self._layers)
