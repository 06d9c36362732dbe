"""``fleetlite.metric``: Paddle's ``paddle.metric`` names, with Paddle's semantics and numbers.

``Metric``, ``Accuracy``, ``Precision``, ``Recall``, ``Auc``; each keeps its
state as sums, so it is exact across ranks. The Trainer also accepts
``torchmetrics`` metrics (optional dependency).

Example::

    from fleetlite.metric import Accuracy, Auc
    acc = Accuracy(topk=(1, 5))
"""

from .trainer.binary_metrics import Auc, Precision, Recall
from .trainer.metrics import Accuracy, Metric

__all__ = ["Metric", "Accuracy", "Precision", "Recall", "Auc"]
