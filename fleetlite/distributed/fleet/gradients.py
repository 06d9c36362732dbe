"""One gradient rule: the global norm of a model's gradients, clipping by it, and averaging over a group.

Every path that clips or averages gradients outside the data-parallel engine's buckets comes here: Paddle's
``HybridParallelClipGrad`` and the Trainer's clippers, the pipeline's gradient reduction,
``fused_allreduce_gradients``, LAMB's and LARS' whole-tensor norms, local SGD's and DGC's averaging group.

# Note [one gradient rule]
The global norm counts every parameter of the full model once, whatever splits it:

* a tensor-parallel slice (``split_axis``: Note [tensor-parallel parameters]) is a different part on each
  rank of the model-parallel group: its sums are added over that group; a replicated parameter is whole on
  every mp rank and counted from this rank's copy alone;
* each pipeline stage holds its own parameters: the sums are added over the pipe group; a weight shared
  between stages counts only where ``is_firstly_shared`` (Paddle's attribute);
* sharding stage 2 (Note [hybrid sharding stage 2]): the caller passes the parameters this rank owns and the
  sums are added over the sharding group (each parameter's owner counts it once);
* an FSDP2-sharded gradient (a DTensor) contributes its local shard, added over its mesh's group of each
  ``Shard`` dimension (a ``Replicate`` dimension, HSDP's, is not added);
* data-parallel replicas (dp × sharding) hold equal, averaged gradients: nothing is added over them.

One all-reduce per group (the values that need a group are stacked), in a fixed order: the DTensor mesh
groups, then model, pipe, sharding. Ranks of one group hold the same structure, so they issue the same
collectives. No host sync: the norm is a tensor. The infinity norm is a max; a NaN anywhere gives a NaN
norm (a max all-reduce alone would drop it, so a NaN flag travels with the value).

Clipping scales every gradient by ``min(1, max_norm / (norm + eps))``, torch's ``clip_grad_norm_`` rule
with ``eps = 1e-6``, which both faces use (Paddle's ``ClipGradByGlobalNorm`` writes
``clip_norm / max(norm, clip_norm)``, the same but for the epsilon).

Averaging (:func:`average_gradients`) divides before it sums (Note [divide before sum]) in flat buffers per
dtype: the pipeline's reduction and ``fused_allreduce_gradients``.

Example::

    groups = GradGroups.of(hcg)                         # or GradGroups(model=mp_group, pipe=pp_group)
    norm = clip_by_global_norm(model.parameters(), 1.0, groups)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

from ...parallel.comm import allreduce_mean_coalesced, group_size

__all__ = ["GradGroups", "data_group_of", "global_norm", "clip_by_global_norm", "clip_coefficient", "tensor_norms",
           "average_gradients"]

_FUSE_BYTES = 128 * 1024 * 1024  # Paddle's fused_allreduce_gradients buffers


def _size(group: Any) -> int:
    return 1 if group is None else tdist.get_world_size(group)


def _real(group: Any) -> Any:
    """``group`` when it has more than one rank, else None (nothing to reduce over)."""
    return group if group is not None and _size(group) > 1 else None


@dataclass(frozen=True)
class GradGroups:
    """The groups the gradient rule reduces over (Note [one gradient rule]); None: not split over that axis.

    ``data``: the ranks that average their gradients (dp × sharding); ``model``: tensor-parallel slices;
    ``pipe``: pipeline stages; ``sharding``: stage 2's owners (the norm is then given the owned parameters).

    Example::

        GradGroups.of(fleet.get_hybrid_communicate_group())
    """

    data: Any = None
    model: Any = None
    pipe: Any = None
    sharding: Any = None

    @classmethod
    def of(cls, hcg: Any, sharding: Any = None) -> GradGroups:
        """The groups of a ``HybridCommunicateGroup`` (``None``: one process or plain data parallel, the world);
        ``sharding``: the stage-2 owners' group, when the gradients are reduced to owners."""
        if hcg is None:
            return cls(sharding=_real(sharding))
        return cls(data=data_group_of(hcg), model=_real(hcg.get_model_parallel_group()),
                   pipe=_real(hcg.get_pipe_parallel_group()), sharding=_real(sharding))


def data_group_of(hcg: Any) -> Any:
    """The ranks that hold the same parameters and read different data, over which gradients are averaged:
    dp × sharding (Note [sharding with mp and pp]); None when that is one rank."""
    return _real(getattr(hcg, "get_data_sharding_parallel_group", hcg.get_data_parallel_group)())


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "device_mesh") and hasattr(t, "placements")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if _is_dtensor(t) else t


def _shard_groups(grad: torch.Tensor) -> tuple[Any, ...]:
    """The groups a DTensor gradient's local shard is added over: one per ``Shard`` mesh dimension."""
    if not _is_dtensor(grad):
        return ()
    out = []
    for dim, placement in enumerate(grad.placements):
        if placement.is_partial():
            raise ValueError("global_norm got a gradient with a Partial placement (its reduction has not run): "
                             "take the norm after backward has reduced the gradients (FSDP2 reduce-scatters them "
                             "at the end of backward)")
        if placement.is_shard():
            out.append(grad.device_mesh.get_group(dim))
    return tuple(g for g in out if _size(g) > 1)


def _all_reduce(x: torch.Tensor, group: Any, inf: bool) -> torch.Tensor:
    """Sum (or, for the infinity norm, max with NaN kept) ``x`` over ``group``; returns the result."""
    if group is None:
        return x
    if not inf:
        tdist.all_reduce(x, group=group)
        return x
    nan = x.isnan()
    both = torch.cat([torch.where(nan, torch.zeros_like(x), x).reshape(-1), nan.float().reshape(-1)])
    tdist.all_reduce(both, op=tdist.ReduceOp.MAX, group=group)
    value, flag = both.chunk(2)
    return torch.where(flag > 0, torch.full_like(value, math.nan), value).view_as(x)


def _combine(values: Sequence[torch.Tensor], inf: bool, device: torch.device) -> torch.Tensor:
    if not values:
        return torch.zeros((), dtype=torch.float32, device=device)
    stacked = torch.stack(list(values))
    return stacked.max() if inf else stacked.sum()


def global_norm(params: Iterable[torch.Tensor], groups: GradGroups | None = None,
                norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type`` norm (2, any p > 0, or ``inf``) of the whole model's gradients, each parameter counted
    once across every axis (Note [one gradient rule]); a float32 tensor, equal on every rank of ``groups``.

    Example::

        norm = global_norm(model.parameters(), GradGroups(model=mp_group))
    """
    groups = groups if groups is not None else GradGroups()
    p = float(norm_type)
    if not p > 0:
        raise ValueError(f"global_norm(norm_type={norm_type!r}): the norm type must be > 0 (2, a p, or inf)")
    inf = math.isinf(p)
    every = list(params)
    device = next((q.grad.device for q in every if q.grad is not None),
                  every[0].device if every else torch.device("cpu"))
    # (shard groups, is a tensor-parallel slice) -> this rank's contributions, in parameter order
    parts: dict[tuple[tuple[Any, ...], bool], list[torch.Tensor]] = {}
    for q in every:
        if q.grad is None or getattr(q, "is_firstly_shared", True) is False:
            continue
        key = (_shard_groups(q.grad), getattr(q, "split_axis", None) is not None)
        local = _local(q.grad).detach()
        if local.numel() == 0:  # an empty FSDP2 shard: the key still takes part in its group's reduction
            parts.setdefault(key, [])
            continue
        n = torch.linalg.vector_norm(local, p, dtype=torch.float32)
        parts.setdefault(key, []).append(n if inf else n.pow(p))
    keys = list(parts)
    values = [_combine(parts[k], inf, device) for k in keys]
    mesh_groups: list[Any] = []  # the DTensor mesh groups, in first-seen order (the same on a group's ranks)
    for shard_groups, _ in keys:
        mesh_groups += [g for g in shard_groups if not any(g is m for m in mesh_groups)]
    for group in mesh_groups:  # one all-reduce per group, for every value that group shards
        idx = [i for i, (sg, _) in enumerate(keys) if any(g is group for g in sg)]
        reduced = _all_reduce(torch.stack([values[i] for i in idx]), group, inf)
        for j, i in enumerate(idx):
            values[i] = reduced[j]
    split = _combine([v for v, (_, s) in zip(values, keys) if s], inf, device)
    whole = _combine([v for v, (_, s) in zip(values, keys) if not s], inf, device)
    split = _all_reduce(split, _real(groups.model), inf)
    total = torch.maximum(split, whole) if inf else split + whole  # (both keep a NaN)
    total = _all_reduce(total, _real(groups.pipe), inf)
    total = _all_reduce(total, _real(groups.sharding), inf)
    return total if inf else total.pow(1.0 / p)


def clip_coefficient(norm: torch.Tensor, max_norm: float, eps: float = 1e-6) -> torch.Tensor:
    """``min(1, max_norm / (norm + eps))``: torch's ``clip_grad_norm_`` rule (Note [one gradient rule])."""
    return torch.clamp(max_norm / (norm + eps), max=1.0)


@torch.no_grad()
def _scale(grads: Sequence[torch.Tensor], coef: torch.Tensor) -> None:
    """Multiply ``grads`` in place by the one value ``coef``, a DTensor through its shard (one foreach kernel per
    device and dtype, as torch's ``clip_grad_norm_``)."""
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        local = _local(g)
        by_kind.setdefault((local.device, local.dtype), []).append(local)
    for (device, dtype), tensors in by_kind.items():
        torch._foreach_mul_(tensors, coef.to(device=device, dtype=dtype))


def clip_by_global_norm(params: Iterable[torch.Tensor], max_norm: float, groups: GradGroups | None = None,
                        norm_type: float = 2.0, eps: float = 1e-6,
                        norm_params: Iterable[torch.Tensor] | None = None) -> torch.Tensor:
    """Scale every gradient of ``params`` by ``min(1, max_norm / (norm + eps))``; returns the global norm.

    ``norm_params``: the parameters the norm counts, when not all of ``params`` (sharding stage 2: the owned
    ones). ``groups=None`` on one process is torch's ``clip_grad_norm_`` (FSDP2 DTensor gradients included).

    Example::

        norm = clip_by_global_norm(model.parameters(), 1.0, GradGroups.of(hcg))
    """
    params = list(params)
    norm = global_norm(params if norm_params is None else norm_params, groups, norm_type)
    _scale([q.grad for q in params if q.grad is not None], clip_coefficient(norm, float(max_norm), eps))
    return norm


def tensor_norms(tensors: Sequence[torch.Tensor], split: Sequence[bool], model_group: Any = None) -> torch.Tensor:
    """The L2 norm of each whole tensor (float32, one per tensor): a tensor-parallel slice's (``split``) squared
    sum is added over ``model_group`` first, one all-reduce for all of them (LAMB's and LARS' layer-wise norms,
    per-tensor clipping). Collective over ``model_group`` when it has more than one rank.

    Example::

        w_norm, g_norm = tensor_norms([p, p.grad], [is_split(p)] * 2, mp_group)
    """
    if not tensors:
        return torch.zeros(0)
    sq = torch.stack([torch.linalg.vector_norm(_local(t).detach(), 2, dtype=torch.float32).square()
                      for t in tensors])
    group = _real(model_group)
    if group is not None and any(split):
        mask = torch.tensor(list(split), device=sq.device)
        part = torch.where(mask, sq, torch.zeros_like(sq))
        tdist.all_reduce(part, group=group)
        sq = torch.where(mask, part, sq)
    return sq.sqrt()


def average_gradients(params: Iterable[torch.Tensor], group: Any, *, agree_missing: bool = False,
                      cap_bytes: int = _FUSE_BYTES) -> None:
    """Average the gradients of ``params`` over ``group`` in place (divided first, summed in flat buffers of at
    most ``cap_bytes`` per dtype); ``None`` group: the world. A missing gradient takes part as zeros. With
    ``agree_missing`` the ranks first agree (one small all-reduce) which parameters have a gradient anywhere
    and skip the others; without it every rank must hold the same parameters (the pipeline's stage replicas).

    Example::

        average_gradients(model.parameters(), hcg.get_data_sharding_parallel_group())
    """
    world = group_size(group)  # (raises when a launcher started several ranks but no group exists)
    unique: dict[int, torch.Tensor] = {}
    for q in params:
        unique.setdefault(id(q), q)
    ps = list(unique.values())
    if world == 1:
        return
    if agree_missing:
        has = torch.tensor([q.grad is not None for q in ps], dtype=torch.int32)
        if ps and ps[0].device.type == "cuda":
            has = has.to(ps[0].device)
        tdist.all_reduce(has, group=group)
        ps = [q for q, n in zip(ps, has.tolist()) if n > 0]
    for q in ps:
        if q.grad is None:  # another rank (or another micro-batch's stage) has one: zeros keep buffers equal
            q.grad = torch.zeros_like(q)
    allreduce_mean_coalesced([q.grad for q in ps], group=group, cap_bytes=cap_bytes)
