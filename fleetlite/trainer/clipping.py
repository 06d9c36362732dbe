"""Gradient clipping: Paddle's ``ClipGradByGlobalNorm`` / ``ClipGradByNorm`` / ``ClipGradByValue`` and Keras'
``clipnorm`` / ``clipvalue`` / ``global_clipnorm``, on torch's ``clip_grad_norm_`` / ``clip_grad_value_``.

# Note [clip order]
The Trainer clips once per optimizer step, right before the real ``optimizer.step()``:
after the all-reduce (every rank clips the same averaged gradient, so the
ranks stay identical), after gradient accumulation (the merged gradient is
clipped once, not each micro-batch), and, with float16 amp, after unscaling
(the threshold applies to true gradients; a step whose gradients overflowed
is still skipped by the scaler). Its clippers are handed to its
``DistributedOptimizer``, which runs them in its step (Note [who clips] in
:mod:`~fleetlite.distributed.fleet.meta_parallel.hybrid_clip`: one decision,
so exactly one clip in every layout); they replace the optimizer's own
``_grad_clip``, which they already include unless ``grad_clip=`` was given.

# Note [hybrid clipping]
Under tensor or pipeline parallelism a rank holds slices (``split_axis``) or
one stage of the model. The global norm (``global_clipnorm``,
``ClipGradByGlobalNorm``) is then the whole model's, each parameter counted
once across dp, mp and pp (Note [hybrid global norm]); the per-tensor norm
(``clipnorm``, ``ClipGradByNorm``) of a slice is the full tensor's (its
squared sum added over the tensor-parallel group); value clipping is
elementwise as it is. Another clipper (a plain callable) is refused there
before training.

Example::

    trainer.compile(opt, loss, global_clipnorm=1.0)                       # Keras
    trainer.compile(opt, loss, grad_clip=ClipGradByGlobalNorm(1.0))       # Paddle
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..distributed.fleet import context as fleet_context
from ..distributed.fleet.gradients import clip_by_global_norm
from ..distributed.fleet.meta_parallel.hybrid_clip import check_clips, step_clipper

__all__ = ["ClipGradByGlobalNorm", "ClipGradByNorm", "ClipGradByValue", "resolve_grad_clip", "clip_gradients",
           "check_hybrid_clipping"]


class ClipGradBase:
    def __call__(self, params: Iterable[torch.nn.Parameter]) -> None:
        raise NotImplementedError


class ClipGradByGlobalNorm(ClipGradBase):
    """Scale all gradients together so their global L2 norm is at most ``clip_norm`` (Paddle's class).

    Example::

        ClipGradByGlobalNorm(1.0)(model.parameters())   # = torch.nn.utils.clip_grad_norm_(params, 1.0)
    """

    def __init__(self, clip_norm: float, group_name: str = "default_group", auto_skip_clip: bool = False) -> None:
        if not clip_norm > 0:
            raise ValueError(f"ClipGradByGlobalNorm(clip_norm={clip_norm!r}) must be > 0")
        self.clip_norm = float(clip_norm)
        self.group_name = group_name
        self.auto_skip_clip = auto_skip_clip

    def __call__(self, params):
        clip_by_global_norm(params, self.clip_norm)  # torch's clip_grad_norm_ rule (Note [one gradient rule])


class ClipGradByNorm(ClipGradBase):
    """Clip each gradient tensor to L2 norm ``clip_norm`` on its own (Paddle's class; Keras' ``clipnorm``).

    Example::

        ClipGradByNorm(1.0)(model.parameters())
    """

    def __init__(self, clip_norm: float) -> None:
        if not clip_norm > 0:
            raise ValueError(f"ClipGradByNorm(clip_norm={clip_norm!r}) must be > 0")
        self.clip_norm = float(clip_norm)

    def __call__(self, params):
        for p in params:
            if p.grad is not None:
                torch.nn.utils.clip_grad_norm_([p], self.clip_norm)


class ClipGradByValue(ClipGradBase):
    """Clamp every gradient element to ``[min, max]`` (``min`` defaults to ``-max``; Paddle's class).

    Example::

        ClipGradByValue(0.5)(model.parameters())   # = torch.nn.utils.clip_grad_value_(params, 0.5)
    """

    def __init__(self, max: float, min: float | None = None) -> None:  # noqa: A002 (Paddle's names)
        min = -max if min is None else min
        if not min < max:
            raise ValueError(f"ClipGradByValue(max={max!r}, min={min!r}): min must be smaller than max")
        self.max, self.min = float(max), float(min)

    def __call__(self, params):
        for p in params:
            if p.grad is not None:
                p.grad.clamp_(self.min, self.max)


def resolve_grad_clip(grad_clip: Any = None, clipnorm: float | None = None, clipvalue: float | None = None,
                      global_clipnorm: float | None = None) -> list[ClipGradBase]:
    """The clippers to apply, from Paddle's ``grad_clip`` object and/or Keras' numbers."""
    out: list[ClipGradBase] = []
    if grad_clip is not None:
        if not callable(grad_clip):
            raise TypeError(f"grad_clip must be a ClipGradBy* object (or a callable taking the parameters), got "
                            f"{type(grad_clip).__name__}")
        out.append(grad_clip)
    if clipnorm is not None and global_clipnorm is not None:
        raise ValueError("clipnorm (per tensor) and global_clipnorm (all tensors together) cannot both be set "
                         "(as in Keras); choose one")
    if global_clipnorm is not None:
        out.append(ClipGradByGlobalNorm(global_clipnorm))
    if clipnorm is not None:
        out.append(ClipGradByNorm(clipnorm))
    if clipvalue is not None:
        out.append(ClipGradByValue(clipvalue))
    return out


def _hcg() -> Any:
    """fleet's HybridCommunicateGroup (the plan's groups), None before ``fleet.init``."""
    return fleet_context.state.hcg


def check_hybrid_clipping(optimizer: Any, clippers: list[Any]) -> None:
    """Before training: a clipper other than Paddle's three classes (Keras' numbers) cannot know the whole model's
    norm where a rank holds slices or one stage (Note [hybrid clipping]); one line saying so."""
    check_clips(clippers, _hcg())


def clip_gradients(optimizer: Any, network: nn.Module, clippers: list[Any]) -> None:
    """Right before ``optimizer.step()``: the one clip of this step (Notes [clip order], [who clips]). A
    ``DistributedOptimizer`` is handed ``clippers`` and clips in its step; another optimizer's are applied here
    to ``network``'s gradients (after unscaling)."""
    clip = step_clipper(optimizer, clippers, _hcg())
    if clip is None:
        return
    amp = getattr(optimizer, "amp", None)
    if amp is not None and amp.uses_scaler:
        amp.unscale_(optimizer.inner_opt)
    clip(network.parameters())
