"""Gradient clipping by global norm across a hybrid mesh (Paddle's ``HybridParallelClipGrad``).

# Note [hybrid global norm]
The global norm must count every parameter of the full model once. Under tensor parallelism a slice
(``split_axis``) is distinct on each mp rank, a replicated parameter is the same on every mp rank; under
pipeline parallelism each stage holds its own parameters; data-parallel replicas hold identical (averaged)
gradients. So: the slices' squared sums are added over the check group (mp × pp × sep of one dp replica),
the replicated ones' over the pipe group only, and nothing is added over dp. Every rank then scales by the
same coefficient, torch's ``clip_grad_norm_`` rule ``min(1, clip_norm / (norm + 1e-6))``.

With sharding stage 2 (Note [hybrid sharding stage 2]) a rank holds only the gradients it owns (the others
are None). Only the owned ones are counted (even where a manual all-reduce left the others), and the sum is
added over the sharding group too: each parameter's owner counts it once. The parameters say so themselves
(``sharded_grad_group``), so every rank of the group takes part even when it holds no gradient at all.

Example::

    norm = clip_grad_norm_hybrid(model.parameters(), 1.0, fleet.get_hybrid_communicate_group())
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as tdist

from .hybrid_sharding import GRAD_GROUP_ATTR, owned_here
from .hybrid_stage3 import clip_grad_norm_stage3, global_norm_stage3, is_stage3
from .mp_layers import is_split
from .mp_ops import group_size

__all__ = ["global_norm_hybrid", "clip_grad_norm_hybrid", "HybridParallelClipGrad", "grad_clip_norm_of"]


def _sq(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum()


def _sharded_grad_group(params: list[torch.Tensor]) -> Any:
    """The sharding group over which the gradients' owners are spread (stage 2), else None."""
    return next((g for p in params if (g := getattr(p, GRAD_GROUP_ATTR, None)) is not None), None)


def global_norm_hybrid(params: Iterable[torch.Tensor], hcg: Any) -> torch.Tensor:
    """The L2 norm of all gradients of the full model, each parameter counted once (Note [hybrid global norm])."""
    every = list(params)
    if is_stage3(every):  # FSDP2 shards beside mp (Note [stage 3 beside mp])
        return global_norm_stage3(every, hcg)
    sharded = _sharded_grad_group(every)
    params = [p for p in (owned_here(every, sharded) if sharded is not None else every) if p.grad is not None]
    device = params[0].grad.device if params else (every[0].device if every else torch.device("cpu"))
    split = _sq([p.grad for p in params if is_split(p)], device)
    replicated = _sq([p.grad for p in params if not is_split(p) and getattr(p, "is_firstly_shared", True)], device)
    check, pipe = hcg._get_replica_group(), hcg.get_pipe_parallel_group()  # Note [sharding with mp and pp]
    if check is not None and group_size(check) > 1:
        tdist.all_reduce(split, group=check)
    if pipe is not None and group_size(pipe) > 1:
        tdist.all_reduce(replicated, group=pipe)
    total = split + replicated
    if sharded is not None and group_size(sharded) > 1:  # stage 2: each owner adds its gradients once
        tdist.all_reduce(total, group=sharded)
    return total.sqrt()


def clip_grad_norm_hybrid(params: Iterable[torch.Tensor], clip_norm: float, hcg: Any) -> torch.Tensor:
    """Scale every gradient by ``min(1, clip_norm / (global_norm + 1e-6))``; returns the global norm."""
    params = list(params)
    if is_stage3(params):  # FSDP2 shards beside mp (Note [stage 3 beside mp])
        return clip_grad_norm_stage3(params, clip_norm, hcg)
    norm = global_norm_hybrid(params, hcg)  # (all of them: Note [hybrid global norm] on stage 2)
    params = [p for p in params if p.grad is not None]
    coef = torch.clamp(clip_norm / (norm + 1e-6), max=1.0)
    with torch.no_grad():
        for p in params:
            p.grad.mul_(coef.to(p.grad.dtype))
    return norm


def grad_clip_norm_of(clip: Any) -> float | None:
    """``clip_norm`` of a Paddle-style ``ClipGradByGlobalNorm`` (duck-typed: the trainer's or Paddle's), else None."""
    if clip is None or "GlobalNorm" not in type(clip).__name__:
        return None
    norm = getattr(clip, "clip_norm", None)
    return float(norm) if norm is not None else None


class HybridParallelClipGrad:
    """Paddle's class: wraps a ``ClipGradByGlobalNorm`` to clip across the hybrid mesh; ``last_norm`` is the
    global norm of the last call.

    Example::

        clip = HybridParallelClipGrad(ClipGradByGlobalNorm(1.0), hcg)
        clip(model.parameters())
    """

    def __init__(self, clip: Any, hcg: Any) -> None:
        norm = grad_clip_norm_of(clip) if not isinstance(clip, (int, float)) else float(clip)
        if norm is None:
            raise TypeError(f"HybridParallelClipGrad needs a ClipGradByGlobalNorm (or a number), got "
                            f"{type(clip).__name__}")
        self.clip_norm, self.hcg, self.last_norm = norm, hcg, None

    def __call__(self, params: Iterable[torch.Tensor]) -> torch.Tensor:
        self.last_norm = clip_grad_norm_hybrid(params, self.clip_norm, self.hcg)
        return self.last_norm
