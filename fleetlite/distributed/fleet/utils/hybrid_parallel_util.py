"""Paddle's ``hybrid_parallel_util``: manual gradient synchronisation."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..gradients import average_gradients, data_group_of

__all__ = ["fused_allreduce_gradients"]

_FUSE_MB = 128


def fused_allreduce_gradients(parameter_list: Iterable[torch.Tensor], hcg=None) -> None:
    """Average the gradients of ``parameter_list`` over all ranks, in place.

    Gradients are coalesced into flat buffers of at most 128 MB per dtype,
    scaled by ``1/world`` and all-reduced. A parameter without a gradient on
    every rank is skipped; one that has a gradient on some ranks only gets a
    zero gradient on the others first (one small extra all-reduce decides),
    so the buffers always match across ranks. ``hcg`` (Paddle's hybrid communicate group) may carry the data
    parallel group as ``get_data_parallel_group()``; ``None`` means the world.
    Single-process it does nothing.

    Example::

        with model.no_sync():
            loss = model(x).mean()
            loss.backward()
        fused_allreduce_gradients(list(model.parameters()), None)
        opt.step()
    """
    # with sharding the ranks holding the same parameters are dp × sharding (Note [sharding with mp and pp])
    group = data_group_of(hcg) if hcg is not None else None
    params = []
    for p in parameter_list:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"fused_allreduce_gradients expects parameters (tensors), got {type(p).__name__}")
        if hasattr(p, "device_mesh") and hasattr(p, "placements"):  # a DTensor: FSDP2 (sharding stage 2/3)
            raise ValueError("fused_allreduce_gradients got sharded (DTensor) parameters: under sharding stage 2/3 "
                             "FSDP reduce-scatters the gradients itself in backward, so there is nothing to "
                             "all-reduce; drop the call (use model.no_sync() / require_backward_grad_sync for "
                             "gradient merge)")
        if p.grad is not None and p.grad.is_sparse:
            raise ValueError("fused_allreduce_gradients: sparse gradients are not supported; "
                             "use a dense embedding (sparse=False)")
        params.append(p)
    if hcg is not None and group is None:  # one rank holds these parameters: nothing to average
        return
    average_gradients(params, group, agree_missing=True, cap_bytes=_FUSE_MB * 1024 * 1024)
