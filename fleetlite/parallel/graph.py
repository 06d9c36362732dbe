"""Autograd-graph helpers of the reducer: output tensors, reachable parameters, dense layouts."""

from __future__ import annotations

import torch

__all__ = ["dense", "output_tensors", "reachable_params"]


def dense(t: torch.Tensor) -> bool:
    """Whether ``t`` is dense and non-overlapping (its strides can lay out a gradient of the same size)."""
    if t.is_contiguous():
        return True
    expected = 1
    for d in sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d])):
        if t.shape[d] == 1:
            continue
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def output_tensors(outputs):
    """The tensors in a forward's output (nested lists, tuples, dicts, dataclasses)."""
    stack = [outputs]
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            yield o
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif hasattr(o, "__dataclass_fields__"):
            stack.extend(getattr(o, f) for f in o.__dataclass_fields__)


def reachable_params(outputs) -> set:
    """Parameters reached by walking the autograd graph back from ``outputs``."""
    roots = [t.grad_fn for t in output_tensors(outputs) if t.grad_fn is not None]
    seen = set()
    reached = set()
    while roots:
        fn = roots.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None:
            reached.add(var)
        roots.extend(nf for nf, _ in fn.next_functions)
    return reached
