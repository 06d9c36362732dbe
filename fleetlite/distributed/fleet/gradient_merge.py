"""Gradient merge (Paddle's ``strategy.gradient_merge``, Lightning's ``accumulate_grad_batches``): the one
implementation, owned by :class:`~fleetlite.distributed.fleet.DistributedOptimizer` as ``optimizer.merge``.

# Note [gradient merge window]
A window is ``k`` micro-batches that make one optimizer step. The backwards of
the first ones run without gradient synchronisation (the attached
data-parallel models' ``require_backward_grad_sync`` is off, as under
``no_sync()``); the window's last backward all-reduces the accumulated sum and
the optimizer steps once; ``zero_grad`` keeps the gradients while a window is
open. With ``avg`` the merged gradient is the mean over the window:

* used alone (a plain ``backward(); step(); clear_grad()`` loop),
  ``optimizer.step()`` counts the micro-batches and the step divides the
  summed gradients by ``k``;
* driven by a training loop (the Trainer: :meth:`GradientMerge.driven`), the
  loop calls :meth:`~GradientMerge.begin` before each micro-batch (it may
  close a window early, at the end of an epoch) and :meth:`~GradientMerge.end`
  after it, and divides each micro-batch's loss by ``k``
  (:meth:`~GradientMerge.scale_loss`), bit-equal to a hand loop that does so;
  the step then divides nothing. Data that ends inside a window (a loader
  without ``len()``) is closed by :meth:`~GradientMerge.flush`.

# Note [open-ended window under sharding]
``flush`` all-reduces what the unsynchronised backwards accumulated. A sharded
model (stage 2/3, FSDP2) cannot do that: its unsynchronised gradients are
unsharded buffers inside FSDP that only a backward reduce-scatters. So when
the loop says the data may end inside the window (``begin(open_ended=True)``,
a loader without ``len()``) and such a model is attached
(``reduces_in_backward_only``), every micro-batch's backward reduce-scatters
and the sharded gradients accumulate the window's sum; the flush then has
nothing left to reduce. Same sum as one reduce-scatter of the summed
gradients (up to float rounding), k reduce-scatters per step instead of one.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from .utils.hybrid_parallel_util import fused_allreduce_gradients

__all__ = ["GradientMerge"]


class GradientMerge:
    """The gradient-merge window of one optimizer (Note [gradient merge window]).

    Example (a training loop driving it, as the Trainer does)::

        merge = dist_opt.merge
        with merge.driven(k=4, avg=True):
            for i, (x, y) in enumerate(batches):
                merge.begin(last=i == len(batches) - 1)   # the last batch closes its window early
                dist_opt.backward(merge.scale_loss(loss_fn(model(x), y)))
                dist_opt.step()                           # steps only when the window closes
                dist_opt.zero_grad()                      # keeps the gradients of an open window
                merge.end()
    """

    def __init__(self, k: int = 1, avg: bool = True) -> None:
        self.k, self.avg = int(k), bool(avg)
        self.micro = 0  # micro-batches already accumulated in the open window
        self.closing = self.k == 1  # the running (or next) micro-batch closes the window
        self.is_driven = False
        self._running = False  # a driven micro-batch has begun and not ended
        self._reduced_each = False  # every micro-batch's backward reduces (Note [open-ended window under sharding])
        self._models: weakref.WeakSet[nn.Module] = weakref.WeakSet()

    # -- models whose gradient synchronisation follows the window ------------------------------------------------
    def attach(self, model: nn.Module) -> None:
        """Switch ``model.require_backward_grad_sync`` with the window (a DataParallel, DDP or sharded model)."""
        self._models.add(model)
        model.require_backward_grad_sync = self.closing

    def _sync(self, flag: bool) -> None:
        for model in list(self._models):
            model.require_backward_grad_sync = flag

    # -- one micro-batch ----------------------------------------------------------------------------------------
    def begin(self, last: bool = False, open_ended: bool = False) -> bool:
        """Start a micro-batch; True when it closes the window (``last`` closes it early): its backward then
        all-reduces and the optimizer steps. ``open_ended``: the data may end inside this window (a loader
        without ``len()``; Note [open-ended window under sharding])."""
        self.closing = last or self.micro + 1 >= self.k
        self._running = self.is_driven
        if self.micro == 0:  # decided once per window
            self._reduced_each = open_ended and self.k > 1 and any(
                getattr(m, "reduces_in_backward_only", False) for m in list(self._models))
        self._sync(self.closing or self._reduced_each)
        return self.closing

    def end(self) -> bool:
        """The micro-batch is done; True when it closed the window (a new one starts)."""
        closed = self.closing
        self.micro = 0 if closed else self.micro + 1
        self._running = False
        return closed

    def on_step(self) -> bool:
        """``optimizer.step()``'s question: does the running micro-batch close the window? Alone, each call is a
        micro-batch (counted here, and the next one begins); driven, the loop ends its micro-batches."""
        closes = self.closing
        if not self.is_driven:
            self.end()
            self.begin()
        elif closes and self._running:
            self.end()
        return closes

    @property
    def holding(self) -> bool:
        """Whether gradients of an open window are being accumulated (``zero_grad`` keeps them)."""
        return self.micro > 0 or self._running

    @property
    def grad_divisor(self) -> int:
        """What the step divides the merged gradients by: ``k`` with ``avg``, unless a driver scaled the loss."""
        return self.k if self.avg and not self.is_driven else 1

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """A driver's micro-batch loss: divided by ``k`` when averaging (the gradients then need no division);
        unchanged when not driven (the step divides the gradients)."""
        return loss / self.k if self.is_driven and self.k > 1 and self.avg else loss

    def flush(self, params: Iterable[torch.Tensor]) -> None:
        """Close a window left open when the data ended inside it: all-reduce the gradients accumulated without
        synchronisation (``fused_allreduce_gradients``; nothing when every backward of the window reduced, Note
        [open-ended window under sharding]); the next ``optimizer.step()`` steps."""
        if not self._reduced_each:
            fused_allreduce_gradients(list(params), None)
        self.closing, self._running = True, self.is_driven

    def reset(self) -> None:
        """Drop the window's position (a loaded optimizer state, the start or end of a driven run)."""
        self.micro, self._running, self._reduced_each = 0, False, False
        self.closing = self.k == 1
        self._sync(self.closing)

    @contextlib.contextmanager
    def driven(self, k: int | None = None, avg: bool | None = None) -> Iterator[GradientMerge]:
        """Let a training loop drive the window (``begin``/``end``, its own loss scaling) with ``k``/``avg``
        (default: the strategy's) for the duration of the block; the strategy's settings come back after."""
        saved = (self.k, self.avg, self.is_driven)
        self.k = int(k) if k is not None else self.k
        self.avg = bool(avg) if avg is not None else self.avg
        self.is_driven = True
        self.reset()
        try:
            yield self
        finally:
            self.k, self.avg, self.is_driven = saved
            self.reset()

    def __repr__(self) -> str:
        return f"GradientMerge(k={self.k}, avg={self.avg}, micro={self.micro})"
