"""Gradient clipping across a hybrid mesh (Paddle's ``HybridParallelClipGrad``), and who clips (one decision).

# Note [who clips]
Exactly one clip per optimizer step, in every layout (one process, dp, sharding, mp, pp, sep, gradient
merge, amp), right before the real optimizer step: after the data-parallel reduction, after gradient-merge
averaging and after amp unscaling. That is where Paddle's ``HybridParallelOptimizer`` clips (its inner
optimizer's step applies ``_grad_clip``) and where torch's and Keras' loops clip (after all-reduce and
unscale, once per optimizer step). :func:`step_clipper` alone decides who runs it:

* a ``fleet.distributed_optimizer`` clips, in a step pre-hook of the optimizer that really steps
  (``hybrid_clip``, a :class:`StepClip`): by default the user optimizer's ``_grad_clip`` (Paddle's
  ``grad_clip=``), in every layout; a training loop that owns clippers (the Trainer's ``compile(grad_clip=,
  clipnorm=, global_clipnorm=, clipvalue=)``, ``fleetlite.Model.prepare(grad_clip=)``) hands them to it
  instead, so they replace, never add to, the optimizer's own;
* any other optimizer (a plain torch optimizer carrying Paddle's ``_grad_clip``, stepped by the pipeline's
  ``train_batch``): the caller runs the clipper :func:`step_clipper` returns, after unscaling.

Whichever runs it, a :class:`StepClip` clips across the plan's groups: the global norm of the whole model
(Note [hybrid global norm]), a tensor-parallel slice's per-tensor norm the full tensor's, value clipping
elementwise as it is. A clipper of another kind (a plain callable) cannot know the model's norm where a
rank holds slices or one stage: it is refused there before training (:func:`check_clips`).

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

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch

from ..gradients import GradGroups, clip_by_global_norm, clip_coefficient, global_norm, tensor_norms
from .hybrid_sharding import GRAD_GROUP_ATTR, owned_here
from .mp_layers import is_split

__all__ = ["global_norm_hybrid", "clip_grad_norm_hybrid", "HybridParallelClipGrad", "grad_clip_norm_of",
           "StepClip", "step_clipper", "check_clips"]


def _sharded_grad_group(params: list[torch.Tensor]) -> Any:
    """The sharding group over which the gradients' owners are spread (stage 2), else None."""
    return next((g for p in params if (g := getattr(p, GRAD_GROUP_ATTR, None)) is not None), None)


def _counted(params: Iterable[torch.Tensor], hcg: Any,
             groups: GradGroups | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor], GradGroups]:
    """(all parameters, those the norm counts on this rank, the groups: the hcg's, else ``groups``'): Note [hybrid
    global norm]."""
    every = list(params)
    sharded = _sharded_grad_group(every)
    counted = owned_here(every, sharded) if sharded is not None else every
    out = GradGroups.of(hcg, sharding=sharded)
    if hcg is None and groups is not None:
        out = replace(groups, sharding=out.sharding)
    return every, counted, out


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


def _tensor_norm_of(clip: Any) -> float | None:
    """``clip_norm`` of a per-tensor ``ClipGradByNorm`` (the trainer's or Paddle's, duck-typed), else None."""
    return float(clip.clip_norm) if type(clip).__name__ == "ClipGradByNorm" else None


def _known(clip: Any) -> bool:
    """One of Paddle's three clipper classes (by norm, by global norm, by value), whose rule the mesh keeps."""
    return type(clip).__name__ in ("ClipGradByGlobalNorm", "ClipGradByNorm", "ClipGradByValue") or isinstance(
        clip, HybridParallelClipGrad)


def _groups(hcg: Any, groups: GradGroups | None) -> GradGroups:
    return GradGroups.of(hcg) if hcg is not None else (groups if groups is not None else GradGroups())


def check_clips(clips: Sequence[Any], hcg: Any = None, groups: GradGroups | None = None) -> None:
    """ValueError, in one line, for a clipper whose norm would be a part's: a plain callable where a rank holds
    tensor-parallel slices or one pipeline stage (Note [who clips])."""
    g = _groups(hcg, groups)
    split = g.model is not None or g.pipe is not None
    for clip in clips:
        if split and not _known(clip):
            raise ValueError(f"gradient clipper {type(clip).__name__} under tensor/pipeline parallelism: a rank holds "
                             "slices or one stage, so a norm it computes is not the model's; use "
                             "ClipGradByGlobalNorm / global_clipnorm, ClipGradByNorm / clipnorm or ClipGradByValue / "
                             "clipvalue")


class StepClip:
    """The one clip before an optimizer step (Note [who clips]): each clipper applied across the mesh.

    ``clips``: the clippers (None: ``owner._grad_clip`` read at each call, Paddle's attribute); ``hcg``: the
    HybridCommunicateGroup (None: ``groups``, else one process or plain data parallel); ``last_norm``: the
    global norm of the last global-norm clip.

    Example::

        clip = StepClip([ClipGradByGlobalNorm(1.0)], fleet.get_hybrid_communicate_group())
        clip(model.parameters())
    """

    def __init__(self, clips: Sequence[Any] | None = None, hcg: Any = None, owner: Any = None,
                 groups: GradGroups | None = None) -> None:
        self.hcg, self.owner, self.groups, self.last_norm = hcg, owner, groups, None
        self.clips: list[Any] | None = None
        if clips is not None:
            self.use(clips)

    def use(self, clips: Sequence[Any] | None) -> None:
        """Clip with ``clips`` from now on (None: back to ``owner._grad_clip``), checked (:func:`check_clips`)."""
        clips = None if clips is None else [c for c in clips if c is not None]
        check_clips(clips or [], self.hcg, self.groups)
        self.clips = clips

    def current(self) -> list[Any]:
        """The clippers the next call applies."""
        if self.clips is not None:
            return self.clips
        own = getattr(self.owner, "_grad_clip", None)
        return [own] if own is not None else []

    @torch.no_grad()
    def __call__(self, params: Iterable[torch.Tensor]) -> None:
        clips = self.current()
        if not clips:
            return
        params = [p for p in params if p.requires_grad]
        model_group = _groups(self.hcg, self.groups).model  # tensor-parallel slices: their norms are added over it
        for clip in clips:
            norm = grad_clip_norm_of(clip)
            if norm is not None or isinstance(clip, HybridParallelClipGrad):
                every, counted, groups = _counted(params, self.hcg, self.groups)
                self.last_norm = clip_by_global_norm(every, clip.clip_norm if norm is None else norm, groups,
                                                     norm_params=counted)
            elif _tensor_norm_of(clip) is not None and model_group is not None:
                self._clip_each(params, _tensor_norm_of(clip), model_group)
            else:  # per tensor on whole tensors (torch's clip_grad_norm_, DTensors too), by value: as they are
                clip(params)

    @staticmethod
    def _clip_each(params: list[torch.Tensor], clip_norm: float, model_group: Any) -> None:
        """Per-tensor clipping where a tensor-parallel slice's norm is the full tensor's."""
        params = [p for p in params if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        norms = tensor_norms(grads, [is_split(p) for p in params], model_group)
        for g, c in zip(grads, clip_coefficient(norms, clip_norm)):  # torch's clip_grad_norm_ rule, per tensor
            g.mul_(c.to(g.dtype))


def step_clipper(optimizer: Any, clips: Sequence[Any] | None = None, hcg: Any = None,
                 groups: GradGroups | None = None) -> StepClip | None:
    """Who clips before ``optimizer.step()`` (Note [who clips]), the one place it is decided: the clipper the
    caller must run itself, or None.

    ``clips``: the caller's clippers (None: the optimizer's ``_grad_clip``). An optimizer that clips in its own
    step (a ``fleet.distributed_optimizer``: its ``hybrid_clip``) is handed the caller's ``clips`` and None is
    returned; otherwise a :class:`StepClip` over ``hcg`` (or ``groups``) when there is anything to clip.

    Example::

        clip = step_clipper(optimizer, hcg=hcg)   # before optimizer.step(), after unscaling
        if clip is not None:
            clip(model.parameters())
    """
    own = getattr(optimizer, "hybrid_clip", None)
    if isinstance(own, StepClip):
        if clips is not None:
            own.use(clips)
        return None
    wanted = [getattr(optimizer, "_grad_clip", None)] if clips is None else list(clips)
    wanted = [c for c in wanted if c is not None]
    return StepClip(wanted, hcg, groups=groups) if wanted else None
