"""Paddle's segment parallelism (``hybrid_configs['sep_degree'] > 1``): the sequence split over the sep axis,
with an all-to-all around attention (DeepSpeed-Ulysses' scheme, Paddle's ``SegmentParallel`` and PaddleNLP's
``ReshardLayer``).

# Note [segment parallelism]
The ranks of one sep group read the same samples and each keeps one equal, contiguous part of the sequence
(:func:`split_inputs_sequence_dim`, inputs and labels alike). Everything but attention works token by token,
so it runs on the local part unchanged. Attention needs every position: before it, an all-to-all turns the
local part of all heads ``[b, s/sep, h, d]`` into the full sequence of ``h/sep`` heads ``[b, s, h/sep, d]``
(:func:`sequence_to_heads`); after it the inverse all-to-all brings the output back to ``[b, s/sep, h, d]``
(:func:`heads_to_sequence`). The backward of an all-to-all is the inverse all-to-all (it only moves values),
so gradients flow to the rank that owns each input. Positions are global: rank ``r`` holds positions
``r * s/sep ... (r + 1) * s/sep - 1`` (offset a position embedding by :func:`sequence_offset`).

The loss: each rank computes the mean loss over its own tokens, ``L_r``. With equal parts the full sequence's
mean is ``L = (1/sep) sum_r L_r``. Every rank calls ``backward`` on its ``L_r``; the all-to-alls' backward
carries the other ranks' terms into this rank's graph, so the gradient left on rank ``r``'s copy of a weight
is ``d(sum_r' L_r')/d w_r`` and, the copies being equal, the true gradient is the sum over the sep ranks:
``dL/dw = (1/sep) sum_r d(sum_r' L_r')/d w_r``, the average over the sep group. Over dp as well, the mean
over dp × sep is the gradient of the whole batch's mean loss (equal batch parts). So ``SegmentParallel`` is
the data-parallel engine over ``hcg.get_dp_sep_parallel_group()``: parameters broadcast from that group's
first rank at wrap time (Paddle broadcasts over sep, then dp: the same result), gradients averaged over it
in buckets during backward. The loss to report is the per-rank loss averaged over dp × sep.

Example::

    s = fleet.DistributedStrategy(); s.hybrid_configs = {"dp_degree": 1, "sep_degree": 2}
    fleet.init(is_collective=True, strategy=s)
    model = fleet.distributed_model(MyTransformer())        # a SegmentParallel
    ids, labels = split_inputs_sequence_dim([ids, labels])   # this rank's part of the sequence
    # in the attention: q, k, v = (sequence_to_heads(t) for t in (q, k, v)); out = heads_to_sequence(attn(q, k, v))

Beside tensor parallelism (``mp_degree > 1``, Paddle's order ``[..., "sep", "mp"]``) the heads are split over mp
first (a ``ColumnParallelLinear(gather_output=False)`` gives this rank ``heads / mp`` of them); the all-to-all
over the sep group then moves between the sequence split and the split of those local heads, so
``heads / mp`` must divide by ``sep``. ``fleet.distributed_model`` gives a ``TensorParallel`` whose engine
averages every gradient over dp × sep (the same rule as above; the mp slices stay each rank's own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as tdist
import torch.nn as nn
import torch.nn.functional as F

from ....parallel import DataParallel
from .. import context

__all__ = ["SegmentParallel", "split_inputs_sequence_dim", "sequence_offset", "sequence_to_heads",
           "heads_to_sequence", "segment_attention", "ReshardQKV", "ReshardLayer", "check_segment_parallel"]


def _hcg() -> Any:
    """fleet's HybridCommunicateGroup; None before ``fleet.init`` or without a hybrid axis (a sep degree of 1)."""
    return context.state.hcg if context.state.strategy is not None else None


def _sep_group(group: Any) -> tuple[Any, int]:
    """The sep group and its size (1 without a process group or a sep axis: nothing to exchange)."""
    if group is None:
        hcg = _hcg()
        if hcg is None or hcg.get_sep_parallel_world_size() == 1:
            return None, 1
        group = hcg.get_sep_parallel_group()
    return group, (tdist.get_world_size(group) if tdist.is_initialized() else 1)


def split_inputs_sequence_dim(inputs: Any, sep_rank: int | None = None, sep_degree: int | None = None) -> Any:
    """Paddle's ``split_inputs_sequence_dim``: this sep rank's part of ``[batch, seq]`` tensors (the last axis
    split into ``sep_degree`` equal parts); a tensor, a list/tuple or a dict of them (None kept).

    Without ``sep_rank``/``sep_degree`` they are the HybridCommunicateGroup's (a sep degree of 1 before
    ``fleet.init`` or without a hybrid topology); with a sep degree of 1 the inputs come back unchanged.

    Example::

        ids, labels = split_inputs_sequence_dim([ids, labels])            # [b, s] -> [b, s / sep]
        part = split_inputs_sequence_dim(ids, sep_rank=1, sep_degree=2)   # the second half
    """
    if sep_rank is None and sep_degree is None:
        hcg = _hcg()
        sep_rank, sep_degree = (hcg.get_sep_parallel_rank(), hcg.get_sep_parallel_world_size()) if hcg else (0, 1)
    if not isinstance(sep_rank, int) or not isinstance(sep_degree, int) or not 0 <= sep_rank < sep_degree:
        raise ValueError(f"split_inputs_sequence_dim needs 0 <= sep_rank < sep_degree (integers), got sep_rank="
                         f"{sep_rank!r}, sep_degree={sep_degree!r}; pass both or neither")
    if sep_degree == 1:
        return inputs

    def split(t: Any) -> Any:
        if t is None:
            return None
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"split_inputs_sequence_dim splits [batch, seq] tensors, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.shape[-1] % sep_degree:
            raise ValueError(f"the sequence length {t.shape[-1]} does not divide into sep_degree {sep_degree} equal "
                             f"parts: pad or cut the sequences to a multiple of {sep_degree}")
        return t.chunk(sep_degree, dim=-1)[sep_rank]

    if isinstance(inputs, Mapping):
        return {k: split(v) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(split(v) for v in inputs)
    return split(inputs)


def sequence_offset(local_len: int, sep_rank: int | None = None) -> int:
    """The global position of this rank's first token: ``sep_rank * local_len`` (Note [segment parallelism])."""
    if sep_rank is None:
        hcg = _hcg()
        sep_rank = hcg.get_sep_parallel_rank() if hcg is not None else 0
    return sep_rank * local_len


def _check_split(x: torch.Tensor, axis: int, sep: int, what: str) -> None:
    hcg = _hcg()
    mp = hcg.get_model_parallel_world_size() if hcg is not None else 1
    if x.shape[axis] % sep and what == "heads" and mp > 1:  # heads split over mp first, then this rank's over sep
        raise ValueError(f"segment parallelism splits this rank's {x.shape[axis]} attention heads (heads / mp_degree "
                         f"{mp}) over sep_degree {sep} ranks, but {x.shape[axis]} is not a multiple of {sep}: make "
                         f"the number of heads a multiple of mp_degree x sep_degree = {mp * sep}")
    if x.shape[axis] % sep:
        raise ValueError(f"segment parallelism splits the {what} axis {axis} of a {tuple(x.shape)} tensor over "
                         f"sep_degree {sep} ranks, but {x.shape[axis]} is not a multiple of {sep}: make the "
                         f"number of attention heads (and the sequence length) a multiple of sep_degree")


def _all_to_all(x: torch.Tensor, group: Any, sep: int, split_axis: int, concat_axis: int) -> torch.Tensor:
    """Part ``j`` of ``x`` along ``split_axis`` goes to rank ``j``; the parts received, in rank order, are
    concatenated along ``concat_axis``."""
    send = torch.stack(x.chunk(sep, dim=split_axis)).contiguous()
    recv = torch.empty_like(send)
    tdist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=concat_axis)


class ReshardQKV(torch.autograd.Function):
    """PaddleNLP's ``ReshardQKV``: the all-to-all of segment parallelism; its backward is the inverse one."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, split_axis: int, concat_axis: int) -> torch.Tensor:
        ctx.group, ctx.split_axis, ctx.concat_axis = group, split_axis, concat_axis
        ctx.sep = tdist.get_world_size(group)
        return _all_to_all(x, group, ctx.sep, split_axis, concat_axis)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _all_to_all(grad, ctx.group, ctx.sep, ctx.concat_axis, ctx.split_axis), None, None, None


def _reshard(x: torch.Tensor, group: Any, split_axis: int, concat_axis: int, what: str) -> torch.Tensor:
    group, sep = _sep_group(group)
    if sep == 1:
        return x
    if x.dim() != 4:
        raise ValueError(f"segment parallelism's all-to-all takes [batch, seq, heads, head_dim] tensors, got "
                         f"{tuple(x.shape)}: view the hidden axis as (heads, head_dim) first")
    _check_split(x, split_axis, sep, what)  # before any communication, the same on every rank
    return ReshardQKV.apply(x, group, split_axis, concat_axis)


def sequence_to_heads(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Before attention: ``[b, s/sep, h, d]`` (this rank's positions, every head) -> ``[b, s, h/sep, d]`` (every
    position, this rank's heads). ``group``: the sep group (default the HybridCommunicateGroup's).

    Example::

        q = sequence_to_heads(q.view(b, s_local, heads, head_dim))
    """
    return _reshard(x, group, 2, 1, "heads")


def heads_to_sequence(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """After attention: ``[b, s, h/sep, d]`` -> ``[b, s/sep, h, d]`` (the inverse of :func:`sequence_to_heads`).

    Example::

        out = heads_to_sequence(attention(q, k, v)).reshape(b, s_local, heads * head_dim)
    """
    return _reshard(x, group, 1, 2, "sequence")


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention: Callable[..., torch.Tensor] | None
                      = None, group: Any = None, **kwargs: Any) -> torch.Tensor:
    """Attention over the whole sequence from this rank's part: ``q``, ``k``, ``v`` ``[b, s/sep, h, d]`` ->
    :func:`sequence_to_heads` -> ``attention(q, k, v, **kwargs)`` on ``[b, h/sep, s, d]`` (default
    ``torch.nn.functional.scaled_dot_product_attention``) -> :func:`heads_to_sequence` -> ``[b, s/sep, h, d]``.
    With a sep degree of 1 (or before ``fleet.init``) it is just the attention. A mask given in ``kwargs`` is the
    full sequence's (``is_causal=True`` is).

    Example::

        q, k, v = qkv.view(b, s_local, heads, 3, head_dim).unbind(3)       # [b, s/sep, h, d] each
        out = segment_attention(q, k, v, is_causal=True).reshape(b, s_local, heads * head_dim)
    """
    q, k, v = (sequence_to_heads(t, group).transpose(1, 2) for t in (q, k, v))
    out = (attention or F.scaled_dot_product_attention)(q, k, v, **kwargs)
    return heads_to_sequence(out.transpose(1, 2), group)


class ReshardLayer(nn.Module):
    """PaddleNLP's ``ReshardLayer``: ``forward(x, split_axis, concat_axis)`` moves a ``[b, s, heads, head_dim]``
    tensor's split from ``concat_axis`` to ``split_axis`` over the sep group (``split_axis=2, concat_axis=1``:
    :func:`sequence_to_heads`; ``split_axis=1, concat_axis=2``: :func:`heads_to_sequence`).

    Example::

        reshard = ReshardLayer()
        q = reshard(q, split_axis=2, concat_axis=1)
    """

    def __init__(self, sep_group: Any = None) -> None:
        super().__init__()
        self.sep_group, self.sep_degree = _sep_group(sep_group)

    def forward(self, x: torch.Tensor, split_axis: int = 2, concat_axis: int = 1) -> torch.Tensor:
        if {split_axis % 4, concat_axis % 4} != {1, 2}:
            raise ValueError(f"ReshardLayer moves the split between the sequence (1) and heads (2) axes of a "
                             f"[b, s, heads, head_dim] tensor, got split_axis={split_axis}, concat_axis={concat_axis}")
        what = "heads" if split_axis % 4 == 2 else "sequence"
        return _reshard(x, self.sep_group, split_axis % 4, concat_axis % 4, what)


def check_segment_parallel(hcg: Any) -> None:
    """Segment parallelism runs beside data and tensor parallelism only: one line for the rest, before any work."""
    others = {"pp_degree": hcg.get_pipe_parallel_world_size(),
              "sharding_degree": hcg.get_sharding_parallel_world_size()}
    beside = [f"{k}={v}" for k, v in others.items() if v > 1]
    if beside:
        raise NotImplementedError(
            f"sep_degree={hcg.get_sep_parallel_world_size()} beside {', '.join(beside)} is not implemented by "
            "fleetlite (yet): segment parallelism runs with dp_degree and mp_degree; set the other degrees to 1")


class SegmentParallel(DataParallel):
    """Paddle's ``SegmentParallel``: what ``fleet.distributed_model`` returns with ``sep_degree > 1``.

    The data-parallel engine over ``hcg.get_dp_sep_parallel_group()`` (Note [segment parallelism]): every
    parameter and buffer broadcast from that group's first rank at construction, gradients averaged over
    dp × sep during backward (buckets, ``no_sync`` and gradient merge as with ``DataParallel``). The model
    itself calls :func:`sequence_to_heads` / :func:`heads_to_sequence` around its attention.

    Example::

        model = SegmentParallel(transformer, fleet.get_hybrid_communicate_group())
    """

    def __init__(self, layers: nn.Module, hcg: Any, strategy: Any = None, **dp_kwargs: Any) -> None:
        if not isinstance(layers, nn.Module):
            raise TypeError(f"SegmentParallel needs a torch.nn.Module, got {type(layers).__name__}")
        check_segment_parallel(hcg)
        group = hcg.get_dp_sep_parallel_group() if hcg.get_sep_parallel_world_size() > 1 else \
            hcg.get_data_parallel_group()
        super().__init__(layers, group=group, **dp_kwargs)
        self._hcg = hcg
        self._strategy = strategy
