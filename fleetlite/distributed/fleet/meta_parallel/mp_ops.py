"""The autograd collectives of tensor parallelism (Paddle's ``mp_ops``; Megatron's four "regions").

# Note [tensor-parallel regions]
A column-parallel layer reads the same input on every rank of the model-parallel (mp) group and writes
a slice of the output features; a row-parallel layer reads a slice of the input features and sums the
ranks' partial outputs. Four functions move activations between the two layouts, each the adjoint of its
backward so that gradients come out right without the optimizer knowing:

=================  =====================================  ===================================
function           forward                                backward
=================  =====================================  ===================================
``_c_identity``    identity (input replicated)            all-reduce (sum the ranks' grads)
``_mp_allreduce``  all-reduce (sum partial outputs)       identity
``_c_split``       keep this rank's slice of the last dim  all-gather along the last dim
``_c_concat``      all-gather along the last dim           keep this rank's slice
=================  =====================================  ===================================

A group of one rank (or none, single-process) makes all four the identity.

Example::

    from fleetlite.distributed.fleet.meta_parallel import mp_ops
    y = mp_ops._mp_allreduce(partial, group)   # the sum over the mp group, gradient passed through
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist

__all__ = ["_c_identity", "_mp_allreduce", "_c_split", "_c_concat", "group_size", "group_rank"]


def group_size(group: Any) -> int:
    """Ranks in ``group`` (1 for None: single-process)."""
    return 1 if group is None else tdist.get_world_size(group)


def group_rank(group: Any) -> int:
    """This rank's index in ``group`` (0 for None)."""
    return 0 if group is None else tdist.get_rank(group)


def _all_reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    if group_size(group) == 1:
        return x
    x = x.contiguous().clone()
    tdist.all_reduce(x, group=group)
    return x


def _split_last(x: torch.Tensor, group: Any) -> torch.Tensor:
    n = group_size(group)
    if n == 1:
        return x
    if x.shape[-1] % n:
        raise ValueError(f"the last dimension ({x.shape[-1]}) is not divisible by the {n} model-parallel ranks")
    return x.chunk(n, dim=-1)[group_rank(group)].contiguous()


def _gather_last(x: torch.Tensor, group: Any) -> torch.Tensor:
    n = group_size(group)
    if n == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(n)]
    tdist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.group), None


class _Concat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _split_last(grad, ctx.group), None


def _c_identity(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Identity forward, all-reduce of the gradient backward (Note [tensor-parallel regions])."""
    return _Identity.apply(x, group) if group_size(group) > 1 else x


def _mp_allreduce(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum over the mp group forward, identity backward (Note [tensor-parallel regions])."""
    return _AllReduce.apply(x, group) if group_size(group) > 1 else x


def _c_split(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """This rank's slice of the last dimension forward, all-gather backward (Note [tensor-parallel regions])."""
    return _Split.apply(x, group) if group_size(group) > 1 else x


def _c_concat(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """All-gather along the last dimension forward, this rank's slice backward (Note [tensor-parallel regions])."""
    return _Concat.apply(x, group) if group_size(group) > 1 else x
