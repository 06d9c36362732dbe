"""Keras' ``class_weight`` and ``sample_weight`` for ``Trainer.fit``.

Training losses become ``sum(loss_i * w_i) / batch_size`` (Keras'
``sum_over_batch_size``), where ``w_i`` is ``class_weight[label_i]`` (1.0 for
classes not listed) times the sample's own weight. Sample weights come as the
last field of each training batch (``fit(..., sample_weight=True)``: the data
yields ``(x, y, w)``), or as a tensor with tensor data (``fit((x, y),
sample_weight=w)``). The loss must accept ``reduction='none'`` (torch's loss
modules do); evaluation is never weighted (as Keras without
``sample_weight`` in ``evaluate``).

Example::

    trainer.fit((x, y), epochs=3, class_weight={0: 1.0, 1: 5.0})
    trainer.fit((x, y), epochs=3, sample_weight=w)          # w: one weight per sample
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SampleWeights", "configure_weights", "weighted_loss"]


class SampleWeights:
    """A fit's weighting: whether batches carry a weight field, and the class-weight table (``trainer.weighting``).

    Example::

        w = SampleWeights(field=True)
        batch, sample = w.split((x, y, sw))      # ((x, y), sw)
        w.of_batch((y,), sample)                 # the per-sample weights (class weight x sample weight)
    """

    def __init__(self, field: bool = False, class_table: torch.Tensor | None = None) -> None:
        self.field = field
        self.class_table = class_table

    def split(self, batch: Any) -> tuple[Any, torch.Tensor | None]:
        """(batch without its weight field, the sample weights) of a training batch."""
        if not self.field:
            return batch, None
        if not isinstance(batch, (list, tuple)) or len(batch) < 3:
            raise ValueError("sample_weight=True: every training batch must be (inputs..., label, weight)")
        return batch[:-1], batch[-1]

    def of_batch(self, labels, sample: torch.Tensor | None) -> torch.Tensor | None:
        """Each sample's weight (None: unweighted)."""
        table = self.class_table
        if table is None and sample is None:
            return None
        w = None
        if table is not None:
            y = labels[0].reshape(-1).long()
            w = table.to(y.device)[y.clamp(max=table.numel() - 1)]
            w = torch.where(y < table.numel(), w, torch.ones_like(w))
        if sample is not None:
            s = sample.reshape(-1).to(torch.float32)
            w = s if w is None else w * s.to(w.device)
        return w


def configure_weights(loss_fn, train_data: Any, class_weight: dict[int, float] | None,
                      sample_weight: Any) -> tuple[Any, SampleWeights]:
    """Validate the options; the training data (weights appended) and the :class:`SampleWeights`."""
    if class_weight is None and (sample_weight is None or sample_weight is False):
        return train_data, SampleWeights()
    if not hasattr(loss_fn, "reduction"):
        raise ValueError("class_weight/sample_weight need a loss with a 'reduction' attribute (torch's loss modules, "
                         "e.g. nn.CrossEntropyLoss()) so per-sample losses can be weighted")
    weights = SampleWeights()
    if class_weight is not None:
        if not isinstance(class_weight, dict) or not class_weight:
            raise ValueError(f"class_weight must be a dict {{class index: weight}}, got {class_weight!r}")
        size = max(int(k) for k in class_weight) + 1
        table = torch.ones(size, dtype=torch.float32)
        for k, v in class_weight.items():
            table[int(k)] = float(v)
        weights.class_table = table
    if isinstance(sample_weight, torch.Tensor):
        if not (isinstance(train_data, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in train_data)):
            raise ValueError("sample_weight as a tensor needs the training data as a tuple of tensors; for other "
                             "data yield (x, y, w) and pass sample_weight=True")
        if sample_weight.shape[0] != train_data[0].shape[0]:
            raise ValueError(f"sample_weight has {sample_weight.shape[0]} weights for {train_data[0].shape[0]} "
                             "samples; give one per sample")
        train_data = (*train_data, sample_weight)
        weights.field = True
    elif sample_weight is True:
        weights.field = True
    elif sample_weight not in (None, False):
        raise TypeError(f"sample_weight must be True (the data yields (x, y, w)) or a tensor, got "
                        f"{type(sample_weight).__name__}")
    return train_data, weights


def weighted_loss(loss_fn: Any, compute_loss: Callable[[Any, Any], torch.Tensor], outputs: Any, labels,
                  weights: torch.Tensor) -> torch.Tensor:
    """``sum(loss_i * w_i) / batch_size`` with ``compute_loss`` (the Trainer's, over ``loss_fn``) per sample."""
    saved = loss_fn.reduction
    loss_fn.reduction = "none"
    try:
        per_sample = compute_loss(outputs, labels)
    finally:
        loss_fn.reduction = saved
    per_sample = per_sample.reshape(per_sample.shape[0], -1).mean(1) if per_sample.dim() > 1 else per_sample
    return (per_sample * weights.to(per_sample.device, per_sample.dtype)).sum() / per_sample.shape[0]
