"""Gradient clipping by global norm across a hybrid mesh (Paddle's ``HybridParallelClipGrad``).

# Note [hybrid global norm]
The global norm must count every parameter of the full model once: Note [one gradient rule] in
``fleetlite.distributed.fleet.gradients`` holds the rule (slices added over mp, stages over pp, shared weights
once, nothing over dp); this module gives it the HybridCommunicateGroup's groups. Every rank then scales by the
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

from ..gradients import GradGroups, clip_by_global_norm, global_norm
from .hybrid_sharding import GRAD_GROUP_ATTR, owned_here

__all__ = ["global_norm_hybrid", "clip_grad_norm_hybrid", "HybridParallelClipGrad", "grad_clip_norm_of"]


def _sharded_grad_group(params: list[torch.Tensor]) -> Any:
    """The sharding group over which the gradients' owners are spread (stage 2), else None."""
    return next((g for p in params if (g := getattr(p, GRAD_GROUP_ATTR, None)) is not None), None)


def _counted(params: Iterable[torch.Tensor], hcg: Any) -> tuple[list[torch.Tensor], list[torch.Tensor], GradGroups]:
    """(all parameters, those the norm counts on this rank, the groups): Note [hybrid global norm]."""
    every = list(params)
    sharded = _sharded_grad_group(every)
    counted = owned_here(every, sharded) if sharded is not None else every
    return every, counted, GradGroups.of(hcg, sharding=sharded)


def global_norm_hybrid(params: Iterable[torch.Tensor], hcg: Any) -> torch.Tensor:
    """The L2 norm of all gradients of the full model, each parameter counted once (Note [hybrid global norm])."""
    _, counted, groups = _counted(params, hcg)
    return global_norm(counted, groups)


def clip_grad_norm_hybrid(params: Iterable[torch.Tensor], clip_norm: float, hcg: Any) -> torch.Tensor:
    """Scale every gradient by ``min(1, clip_norm / (global_norm + 1e-6))``; returns the global norm."""
    every, counted, groups = _counted(params, hcg)
    return clip_by_global_norm(every, clip_norm, groups, norm_params=counted)


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
