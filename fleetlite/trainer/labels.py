"""Class-index labels for torch's class-index losses, shared by both faces' ``compute_loss``: Paddle's and Keras'
``[N, 1]`` integer labels (Paddle's ``CrossEntropyLoss``, Keras' ``SparseCategoricalCrossentropy`` take them) reach
torch's ``CrossEntropyLoss``/``NLLLoss`` as the ``[N]`` class indices torch wants.

Example::

    class_index_labels(nn.CrossEntropyLoss(), logits, (y.view(-1, 1),))    # (y,): shape [N], int64
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["class_index_labels"]


# torch's class-index losses: Paddle's CrossEntropyLoss takes labels [N, 1], these want [N] (both faces' compute_loss)
_CLASS_INDEX_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss)
_CLASS_INDEX_FUNCTIONS = (F.cross_entropy, F.nll_loss)


def class_index_labels(loss_fn: Any, outputs: Any, labels: Sequence[Any]) -> tuple[Any, ...]:
    """Paddle's ``[N, 1]`` integer labels as torch's ``[N]`` class indices, for torch's class-index losses.

    Only when ``loss_fn`` is ``nn.CrossEntropyLoss``/``nn.NLLLoss`` (or a subclass) or ``F.cross_entropy``/
    ``F.nll_loss``, there is one output of shape ``[N, C]`` and one integer label of shape ``[N, 1]``: the
    trailing 1 is squeezed (and the indices made int64, as torch wants). Anything else is passed unchanged (a
    user's own loss gets the labels as they come)."""
    outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if not (isinstance(loss_fn, _CLASS_INDEX_LOSSES) or loss_fn in _CLASS_INDEX_FUNCTIONS):
        return tuple(labels)
    if len(outs) != 1 or len(labels) != 1:
        return tuple(labels)
    out, y = outs[0], labels[0]
    if (isinstance(out, torch.Tensor) and isinstance(y, torch.Tensor) and out.dim() == 2 and y.dim() == 2
            and y.shape == (out.shape[0], 1) and not (y.is_floating_point() or y.is_complex())
            and y.dtype != torch.bool):
        return (y.squeeze(1).long(),)
    return tuple(labels)
