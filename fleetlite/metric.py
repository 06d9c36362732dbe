"""``fleetlite.metric``: Paddle's ``paddle.metric`` names (``Metric``, ``Accuracy``).

Example::

    from fleetlite.metric import Accuracy
    acc = Accuracy(topk=(1, 5))
"""

from .trainer.metrics import Accuracy, Metric

__all__ = ["Metric", "Accuracy"]
