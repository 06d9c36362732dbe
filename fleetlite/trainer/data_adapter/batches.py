"""Batch helpers of the loops: samples in a batch, moving a batch to the device, Keras' ``(x, y)`` arguments."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["batch_length", "to_device", "keras_xy", "keras_evaluate_args"]


def batch_length(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (0 when there is none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for v in batch:
            n = batch_length(v)
            if n:
                return n
    return 0


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested) batch to ``device`` (non-blocking; tensors already there are kept)."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(b, device) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def keras_xy(x: Any, y: Any, call: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(x, y)`` when ``call(x, y)`` is Keras' layout (inputs and labels as two tensors), else None.

    Raises a short ``ValueError`` when both are tensors whose first dimensions differ.
    """
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return None
    if x.dim() == 0 or y.dim() == 0 or x.shape[0] != y.shape[0]:
        raise ValueError(f"{call}(x, y) with x of shape {tuple(x.shape)} and y of shape {tuple(y.shape)}: inputs "
                         f"and labels need the same first dimension (one label per sample); or pass the data as "
                         f"one argument: {call}((x, y))")
    return x, y


def keras_evaluate_args(data: Any, batch_size: Any) -> tuple[Any, Any]:
    """``(data, batch_size)`` of ``evaluate``, recognising Keras' ``evaluate(x, y)`` (labels in the batch_size slot).

    A tensor there that is not ``x``'s labels is a short ``TypeError`` (not the whole tensor printed).
    """
    if not isinstance(batch_size, torch.Tensor):
        return data, batch_size
    xy = keras_xy(data, batch_size, "evaluate")
    if xy is None:
        raise TypeError(f"evaluate: batch_size must be a positive integer, got a tensor of shape "
                        f"{tuple(batch_size.shape)}; pass labels as evaluate((x, y)) or evaluate(x, y)")
    return xy, 32
