"""Paddle's ``hybrid_parallel_util``: manual gradient synchronisation."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ....parallel.comm import allreduce_mean_coalesced

__all__ = ["fused_allreduce_gradients"]

_FUSE_MB = 128


def fused_allreduce_gradients(parameter_list: Iterable[torch.Tensor], hcg=None) -> None:
    """Average the gradients of ``parameter_list`` over all ranks, in place.

    Gradients are coalesced into flat buffers of at most 128 MB per dtype,
    scaled by ``1/world`` and all-reduced; parameters without a gradient are
    skipped. ``hcg`` (Paddle's hybrid communicate group) may carry the data
    parallel group as ``get_data_parallel_group()``; ``None`` means the world.
    Single-process it does nothing.

    Example::

        with model.no_sync():
            loss = model(x).mean()
            loss.backward()
        fused_allreduce_gradients(list(model.parameters()), None)
        opt.step()
    """
    group = hcg.get_data_parallel_group() if hcg is not None else None
    grads = []
    seen = set()
    for p in parameter_list:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"fused_allreduce_gradients expects parameters (tensors), got {type(p).__name__}")
        g = p.grad
        if g is None or id(p) in seen:
            continue
        if g.is_sparse:
            raise ValueError("fused_allreduce_gradients: sparse gradients are not supported; "
                             "use a dense embedding (sparse=False)")
        seen.add(id(p))
        grads.append(g)
    allreduce_mean_coalesced(grads, group=group, cap_bytes=_FUSE_MB * 1024 * 1024)
