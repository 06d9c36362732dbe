"""``fleetlite.metric``: Paddle's ``paddle.metric`` names, with Paddle's semantics and numbers.

``Metric``, ``Accuracy``, ``Precision``, ``Recall``, ``Auc``; each keeps its
state as sums, so it is exact across ranks. ``accuracy`` is Paddle's
functional form. The Trainer also accepts ``torchmetrics`` metrics (optional
dependency).

Example::

    import torch
    from fleetlite.metric import Accuracy, Auc, accuracy
    acc = Accuracy(topk=(1, 5))
    top1 = accuracy(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([[1], [1]]), k=1)   # tensor(0.5000)
"""

from __future__ import annotations

import torch

from .trainer.binary_metrics import Auc, Precision, Recall
from .trainer.metrics import Accuracy, Metric

__all__ = ["Metric", "Accuracy", "Precision", "Recall", "Auc", "accuracy"]


def accuracy(input: torch.Tensor, label: torch.Tensor, k: int = 1, correct: torch.Tensor | None = None,
             total: torch.Tensor | None = None, name: str | None = None) -> torch.Tensor:
    """Paddle's ``paddle.metric.accuracy``: the fraction of samples whose label is among the ``k`` highest scores.

    Args:
        input: scores ``[N, C]`` (probabilities or logits).
        label: class indices ``[N, 1]`` (Paddle's layout) or ``[N]``, integer.
        k: how many top scores count as a hit.
        correct, total: optional tensors that receive the number of hits and of samples (as Paddle's).
        name: unused (Paddle's).

    Returns:
        A float32 scalar tensor (shape ``[]``, as Paddle's since 2.5), without gradient.
    """
    if not isinstance(input, torch.Tensor) or input.dim() != 2:
        raise ValueError(f"accuracy: input must be a [N, C] tensor of scores, got "
                         f"{tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__}")
    if not isinstance(label, torch.Tensor) or label.is_floating_point() or label.is_complex():
        raise TypeError(f"accuracy: label must be an integer tensor of class indices, got "
                        f"{label.dtype if isinstance(label, torch.Tensor) else type(label).__name__}")
    if label.dim() == 2 and label.shape[1] == 1:
        label = label[:, 0]
    if label.dim() != 1 or label.shape[0] != input.shape[0]:
        raise ValueError(f"accuracy: label must be [N, 1] or [N] with N = {input.shape[0]} (input's rows), got "
                         f"{tuple(label.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= input.shape[1]:
        raise ValueError(f"accuracy: k must be an integer in [1, {input.shape[1]}] (the number of classes), got {k!r}")
    with torch.no_grad():
        top = input.topk(k, dim=1).indices
        hits = (top == label.to(top.device, torch.int64).unsqueeze(1)).any(dim=1).sum()
        n = label.shape[0]
        if correct is not None:
            correct.copy_(hits.reshape(correct.shape))
        if total is not None:
            total.fill_(n)
        return (hits.to(torch.float32) / max(n, 1)).reshape(())
