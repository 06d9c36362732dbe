"""Paddle's ``hybrid_parallel_util``: manual gradient synchronisation."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as tdist

from ....parallel.comm import allreduce_mean_coalesced, group_size

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
    group = getattr(hcg, "get_data_sharding_parallel_group", hcg.get_data_parallel_group)() if hcg is not None else None
    params, seen = [], set()
    for p in parameter_list:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"fused_allreduce_gradients expects parameters (tensors), got {type(p).__name__}")
        if id(p) in seen:
            continue
        if hasattr(p, "device_mesh") and hasattr(p, "placements"):  # a DTensor: FSDP2 (sharding stage 2/3)
            raise ValueError("fused_allreduce_gradients got sharded (DTensor) parameters: under sharding stage 2/3 "
                             "FSDP reduce-scatters the gradients itself in backward, so there is nothing to "
                             "all-reduce; drop the call (use model.no_sync() / require_backward_grad_sync for "
                             "gradient merge)")
        if p.grad is not None and p.grad.is_sparse:
            raise ValueError("fused_allreduce_gradients: sparse gradients are not supported; "
                             "use a dense embedding (sparse=False)")
        seen.add(id(p))
        params.append(p)
    if group_size(group) == 1:
        return
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
    if params and params[0].device.type == "cuda":
        has = has.to(params[0].device)
    tdist.all_reduce(has, group=group)
    grads = []
    for p, n in zip(params, has.tolist()):
        if n == 0:
            continue
        if p.grad is None:  # another rank has a gradient: contribute zeros so the buffers match
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    allreduce_mean_coalesced(grads, group=group, cap_bytes=_FUSE_MB * 1024 * 1024)
