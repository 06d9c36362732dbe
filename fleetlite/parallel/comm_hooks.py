"""Communication hooks: torch's ``GradBucket`` interface over our buckets.

A hook registered with :meth:`DataParallel.register_comm_hook` is called as
``hook(state, bucket) -> torch.futures.Future[Tensor]`` once per bucket and
step, exactly as torch DDP calls it, so torch's own hooks work unchanged
(``default_hooks.allreduce_hook``, ``fp16_compress_hook``,
``bf16_compress_hook``, ``powerSGD_hook.powerSGD_hook`` with ``PowerSGDState``).

Note [hook buffers]
    ``bucket.buffer()`` is the gradient part of the flat bucket, unscaled:
    the hook divides (as torch's hooks do), so the engine's own
    Note [divide before sum] is skipped when a hook is registered.
    ``bucket.gradients()`` are the parameter-shaped views of that buffer
    (the very tensors ``param.grad`` points at), so a hook that writes into
    them (PowerSGD) writes the result in place. The bucket tail (Note
    [bucket tail]) never goes through a hook: it is all-reduced on its own
    after every hook's future completed, so a hook cannot corrupt the error
    checks and its chained collectives cannot interleave with the tail's.
    Hooks are called in bucket order (Note [bucket order]); collectives a
    hook launches later from a future's callback (PowerSGD's second
    all-reduce) are ordered by the backend, exactly as under torch DDP.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

__all__ = ["GradBucket", "check_comm_hook"]


class GradBucket:
    """What a communication hook sees of one bucket (torch's ``dist.GradBucket`` methods).

    Example::

        def hook(state, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())   # no communication: keep local gradients
            return fut
    """

    __slots__ = ("_index", "_buffer", "_grads", "_params", "_last")

    def __init__(self, index: int, buffer: torch.Tensor, gradients: list[torch.Tensor],
                 parameters: list[torch.Tensor], is_last: bool):
        self._index, self._buffer, self._grads, self._params, self._last = (
            index, buffer, gradients, parameters, is_last)

    def index(self) -> int:
        """Position of the bucket in reduction order (0 is reduced first)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat, unscaled gradients of the bucket (1-D)."""
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        """Per-parameter views of :meth:`buffer`, parameter-shaped."""
        return list(self._grads)

    def parameters(self) -> list[torch.Tensor]:
        """The parameters whose gradients the bucket holds, in bucket order."""
        return list(self._params)

    def is_last(self) -> bool:
        """Whether this is the last bucket all-reduced in the step."""
        return self._last

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the tensor :meth:`buffer` returns (torch's semantics)."""
        self._buffer = buffer


def check_comm_hook(hook: Callable) -> None:
    """Validate a hook's signature as torch DDP does, before any step runs."""
    if not callable(hook):
        raise TypeError(f"Communication hook must be callable. (got {type(hook).__name__})")
    try:
        sig = inspect.signature(hook)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in params):
        raise TypeError("register_comm_hook: the hook must take (state, bucket) and return a "
                        "torch.futures.Future[torch.Tensor]")
    # as torch DDP, with postponed (string) annotations accepted as they are
    bucket = sig.parameters.get("bucket")
    if bucket is not None and not isinstance(bucket.annotation, str) and bucket.annotation not in (
            inspect.Parameter.empty, GradBucket, torch.distributed.GradBucket):
        raise ValueError("Communication hook: bucket annotation should be dist.GradBucket.")
    ret = sig.return_annotation
    if not isinstance(ret, str) and ret not in (inspect.Signature.empty, torch.futures.Future[torch.Tensor]):
        raise ValueError("Communication hook: return annotation should be torch.futures.Future[torch.Tensor].")


def future_tensor(fut) -> torch.Tensor:
    """The tensor a hook's future resolves to (a tensor, or a one-element list of tensors)."""
    val = fut.wait()
    if isinstance(val, (list, tuple)):
        if len(val) != 1:
            raise RuntimeError(f"a communication hook's future must hold one tensor, got {len(val)}")
        val = val[0]
    if not isinstance(val, torch.Tensor):
        raise RuntimeError("a communication hook's future must hold a torch.Tensor (the reduced bucket), "
                           f"got {type(val).__name__}")
    return val
