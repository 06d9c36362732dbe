"""Paddle's tensor-parallel layers (``fleet.meta_parallel``): ``ColumnParallelLinear``, ``RowParallelLinear``,
``VocabParallelEmbedding`` and ``ParallelCrossEntropy``, on plain torch parameters and the autograd
collectives of :mod:`.mp_ops` (Note [tensor-parallel regions]).

# Note [tensor-parallel parameters]
Each rank of the model-parallel (mp) group holds a plain ``nn.Parameter`` with its slice of the full
weight, marked with ``param.split_axis`` (the sliced dimension, in torch's layout: ``weight`` is
``[out_features, in_features]``) and ``param.mp_group``; replicated parameters have no ``split_axis``.
Plain tensors keep every torch optimizer (foreach kernels), ``GradScaler``, the data-parallel engine
and the clip code working unchanged. (Paddle's ``param.is_distributed`` is not set: on a torch tensor that
name is a method, always truthy; use :func:`is_split`.) Every tensor's place in the full one is given by
:func:`placements_of`: DTensor placements on the mp mesh dimension, ``Shard(split_axis)`` for a slice and
``Replicate()`` for anything else. The checkpoint view (:func:`~.sharded_state.global_view`) reads only that:
it views every tensor as ``DTensor.from_local(t, mp mesh, placements_of(t))``, which
``torch.distributed.checkpoint`` saves and reloads at any mp degree.

The full weight is initialised (torch's ``nn.Linear`` / ``nn.Embedding`` init, or ``weight_attr``) from the
global generator and sliced, so a run seeded alike on every rank starts from the weights a single process
would draw (Paddle draws each shard separately).

Example::

    from fleetlite.distributed import fleet
    s = fleet.DistributedStrategy(); s.hybrid_configs = {"mp_degree": 2}
    fleet.init(is_collective=True, strategy=s)
    up = fleet.meta_parallel.ColumnParallelLinear(64, 256, has_bias=True, gather_output=False)
    down = fleet.meta_parallel.RowParallelLinear(256, 64, input_is_parallel=True)
    y = down(torch.relu(up(x)))          # = the single-process MLP
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import mp_ops
from .mp_ops import _c_concat, _c_identity, _c_split, _mp_allreduce, group_rank, group_size

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelCrossEntropy",
           "is_split", "placements_of"]


def is_split(param: torch.Tensor) -> bool:
    """True for a tensor-parallel slice (Note [tensor-parallel parameters]); False for a replicated parameter."""
    return getattr(param, "split_axis", None) is not None


def placements_of(param: torch.Tensor) -> list[Any]:
    """``param``'s DTensor placements on the mp mesh dimension (Note [tensor-parallel parameters]): a slice is
    ``Shard(split_axis)`` (``torch.chunk`` of the full tensor, this rank's piece), anything else ``Replicate()``.

    Example::

        placements_of(ColumnParallelLinear(4, 8).weight), placements_of(torch.zeros(2))  # [Shard(0)], [Replicate()]
    """
    from torch.distributed.tensor import Replicate, Shard  # ~0.5 s, on use

    axis = getattr(param, "split_axis", None)
    return [Replicate() if axis is None else Shard(axis)]


def _mp_group(mp_group: Any, what: str) -> Any:
    """The model-parallel group: the one given, else the HybridCommunicateGroup's (fleet.init first)."""
    if mp_group is not None:
        return mp_group
    from .. import context
    from ..base import topology

    if context.state.strategy is None:
        raise RuntimeError(f"{what} was built before fleet.init(); call fleet.init(is_collective=True, strategy=s) "
                           "with s.hybrid_configs['mp_degree'] first, then build the model")
    # a data-parallel strategy's plan is built now, for its (trivial) mp group (collective)
    return topology.hcg_of(context.state.plan).get_model_parallel_group()


def _check_divisible(what: str, name: str, size: int, n: int) -> None:
    if size % n:
        raise ValueError(f"{what}: {name} = {size} is not divisible by mp_degree {n}; choose a size that "
                         f"mp_degree divides (or another mp_degree)")


def _initializer(weight_attr: Any, what: str) -> Callable[[torch.Tensor], Any] | None:
    if weight_attr is None or weight_attr is False:
        return None
    init = getattr(weight_attr, "initializer", weight_attr)  # a ParamAttr-like object or the initializer itself
    if not callable(init):
        raise TypeError(f"{what}: weight_attr must be an initializer (a callable taking the full weight, e.g. "
                        f"torch.nn.init.xavier_uniform_) or None, got {type(weight_attr).__name__}")
    return init


def _sliced(full: torch.Tensor, axis: int, group: Any) -> nn.Parameter:
    n, r = group_size(group), group_rank(group)
    # a copy: a view (a chunk along dim 0 is already contiguous) would keep the full weight's storage alive
    part = full.chunk(n, dim=axis)[r].clone(memory_format=torch.contiguous_format) if n > 1 else full
    param = nn.Parameter(part)
    if n > 1:
        param.split_axis, param.mp_group = axis, group
    return param


def _full_linear(out_f: int, in_f: int, init: Callable | None) -> torch.Tensor:
    w = torch.empty(out_f, in_f)
    if init is None:
        nn.init.kaiming_uniform_(w, a=math.sqrt(5))  # nn.Linear's
    else:
        init(w)
    return w


class ColumnParallelLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W``'s output features split over the mp group (Paddle's class).

    The input is replicated; each rank computes its slice of the output features. ``gather_output``:
    all-gather the slices (the full output on every rank); else the slice (feed a ``RowParallelLinear``
    with ``input_is_parallel=True``). ``has_bias=None`` means no bias, as in Paddle; a bias starts at zero.
    ``fuse_matmul_bias`` is accepted (``F.linear`` fuses already). Build it after ``fleet.init``.

    Example::

        layer = ColumnParallelLinear(16, 32, has_bias=True, gather_output=True)
        layer(torch.randn(4, 16)).shape   # (4, 32) on every rank
    """

    def __init__(self, in_features: int, out_features: int, weight_attr: Any = None, has_bias: bool | None = None,
                 gather_output: bool = True, fuse_matmul_bias: bool = False, mp_group: Any = None,
                 name: str | None = None) -> None:
        super().__init__()
        self.model_parallel_group = _mp_group(mp_group, "ColumnParallelLinear")
        self.world_size = group_size(self.model_parallel_group)
        _check_divisible("ColumnParallelLinear", "out_features", out_features, self.world_size)
        self.in_features, self.out_features = in_features, out_features
        self.output_size_per_partition = out_features // self.world_size
        self.gather_output, self.is_mp = gather_output, self.world_size > 1
        self._name = name
        init = _initializer(weight_attr, "ColumnParallelLinear")
        self.weight = _sliced(_full_linear(out_features, in_features, init), 0, self.model_parallel_group)
        self.bias = _sliced(torch.zeros(out_features), 0, self.model_parallel_group) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(_c_identity(x, self.model_parallel_group), self.weight, self.bias)
        return _c_concat(out, self.model_parallel_group) if self.gather_output else out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} ({self.output_size_per_partition}"
                f" per rank), bias={self.bias is not None}, gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W``'s input features split over the mp group (Paddle's class).

    ``input_is_parallel``: ``x`` is already this rank's slice of the input features (a
    ``ColumnParallelLinear(gather_output=False)``'s output); else the full input is sliced here. The
    partial products are summed over the group; the bias (replicated) is added after.

    Example::

        layer = RowParallelLinear(32, 16, input_is_parallel=False)
        layer(torch.randn(4, 32)).shape   # (4, 16) on every rank
    """

    def __init__(self, in_features: int, out_features: int, weight_attr: Any = None, has_bias: bool = True,
                 input_is_parallel: bool = False, fuse_matmul_bias: bool = False, mp_group: Any = None,
                 name: str | None = None) -> None:
        super().__init__()
        self.model_parallel_group = _mp_group(mp_group, "RowParallelLinear")
        self.world_size = group_size(self.model_parallel_group)
        _check_divisible("RowParallelLinear", "in_features", in_features, self.world_size)
        self.in_features, self.out_features = in_features, out_features
        self.input_size_per_partition = in_features // self.world_size
        self.input_is_parallel, self.is_mp = input_is_parallel, self.world_size > 1
        self._name = name
        init = _initializer(weight_attr, "RowParallelLinear")
        self.weight = _sliced(_full_linear(out_features, in_features, init), 1, self.model_parallel_group)
        self.bias = nn.Parameter(torch.zeros(out_features)) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = _c_split(x, self.model_parallel_group)
        out = _mp_allreduce(F.linear(x, self.weight), self.model_parallel_group)
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} ({self.input_size_per_partition} per rank), out_features="
                f"{self.out_features}, bias={self.bias is not None}, input_is_parallel={self.input_is_parallel}")


class VocabParallelEmbedding(nn.Module):
    """An embedding table whose rows (the vocabulary) are split over the mp group (Paddle's class).

    Each rank looks up the ids in its range (others give zeros) and the results are summed over the group,
    so the output is the full embedding on every rank; the gradient stays a slice of the table's size.

    Example::

        emb = VocabParallelEmbedding(1000, 64)
        emb(torch.tensor([[1, 999]])).shape   # (1, 2, 64)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, weight_attr: Any = None, mp_group: Any = None,
                 name: str | None = None) -> None:
        super().__init__()
        self.model_parallel_group = _mp_group(mp_group, "VocabParallelEmbedding")
        self.world_size = group_size(self.model_parallel_group)
        _check_divisible("VocabParallelEmbedding", "num_embeddings (the vocabulary)", num_embeddings, self.world_size)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.per_part_size = num_embeddings // self.world_size
        self.vocab_start_index = group_rank(self.model_parallel_group) * self.per_part_size
        self.is_mp = self.world_size > 1
        self._name = name
        init = _initializer(weight_attr, "VocabParallelEmbedding")
        full = torch.empty(num_embeddings, embedding_dim)
        nn.init.normal_(full) if init is None else init(full)  # nn.Embedding's init by default
        self.weight = _sliced(full, 0, self.model_parallel_group)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.is_mp:
            return F.embedding(ids, self.weight)
        start, end = self.vocab_start_index, self.vocab_start_index + self.per_part_size
        outside = (ids < start) | (ids >= end)
        local = (ids - start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return _mp_allreduce(out, self.model_parallel_group)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim} ({self.per_part_size} rows per rank)"


class _VocabParallelCE(torch.autograd.Function):
    """Softmax cross entropy over logits whose last dimension (the classes) is split over the group."""

    @staticmethod
    def forward(ctx, logits, label, group, ignore_index):
        n_local = logits.shape[-1]
        start = mp_ops.group_rank(group) * n_local
        logits = logits.float()
        lmax = logits.max(dim=-1).values
        if group_size(group) > 1:
            torch.distributed.all_reduce(lmax, op=torch.distributed.ReduceOp.MAX, group=group)
        shifted = logits - lmax.unsqueeze(-1)
        ignored = label == ignore_index
        outside = (label < start) | (label >= start + n_local) | ignored
        local = (label - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        if group_size(group) > 1:
            both = torch.stack([picked, sum_exp])
            torch.distributed.all_reduce(both, group=group)
            picked, sum_exp = both[0], both[1]
        loss = (sum_exp.log() - picked).masked_fill(ignored, 0.0)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local, outside, ignored)
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside, ignored = ctx.saved_tensors
        g = softmax.clone()
        hit = (~outside).to(g.dtype)
        g.scatter_add_(-1, local.unsqueeze(-1), -hit.unsqueeze(-1))
        g = g * (grad * (~ignored).to(g.dtype)).unsqueeze(-1)
        return g, None, None, None


class ParallelCrossEntropy(nn.Module):
    """Cross entropy on logits split over the mp group's classes (a ``ColumnParallelLinear(gather_output=False)``
    head), without gathering them (Paddle's class).

    Returns the per-sample loss (no reduction, float32), shaped like ``label`` (Paddle's ``[N, 1]`` labels
    give ``[N, 1]``); samples whose label is ``ignore_index`` get 0.

    Example::

        loss = ParallelCrossEntropy()(logits_slice, labels).mean()
    """

    def __init__(self, mp_group: Any = None, name: str | None = None, ignore_index: int = -100) -> None:
        super().__init__()
        self.model_parallel_group = _mp_group(mp_group, "ParallelCrossEntropy")
        self.ignore_index = ignore_index
        self._name = name

    def forward(self, input: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        keep_dim = label.dim() == input.dim() and label.shape[-1] == 1
        flat_label = label.squeeze(-1) if keep_dim else label
        if flat_label.shape != input.shape[:-1]:
            raise ValueError(f"ParallelCrossEntropy: label shape {tuple(label.shape)} does not match the logits' "
                             f"{tuple(input.shape)} (give one class id per row, shaped [..] or [.., 1])")
        loss = _VocabParallelCE.apply(input, flat_label.long(), self.model_parallel_group, self.ignore_index)
        return loss.unsqueeze(-1) if keep_dim else loss
