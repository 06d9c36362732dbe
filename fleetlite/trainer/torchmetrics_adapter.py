"""``torchmetrics`` metrics in the Trainer: exact across ranks, padding excluded.

The Trainer wraps a ``torchmetrics.Metric`` in :class:`TorchMetric`: each
batch's real samples (the distributed sampler's padding cut off first) go to
``update(preds, target)``; the epoch value is ``compute()``, which gathers
the states of every rank of the data group (torchmetrics' own sync over its
``process_group``; under tensor or pipeline parallelism the data-parallel
group) when the data is split across ranks, and stays local when every rank
holds the whole data. No value is computed per batch (``compute`` can be costly, e.g. AUROC sorts every
sample seen), so torchmetrics values appear in the epoch logs only.

Example::

    import torchmetrics
    trainer = fleetlite.Trainer(net, opt, loss, metrics=[torchmetrics.F1Score(task="binary")])
    trainer.evaluate(data)   # {"loss": ..., "binaryf1score": ...}
"""

from __future__ import annotations

import re
from typing import Any

from .metrics import Metric

__all__ = ["TorchMetric", "is_torchmetric"]


def is_torchmetric(obj: Any) -> bool:
    """True for a ``torchmetrics.Metric`` (without importing torchmetrics when it is not loaded)."""
    import sys

    tm = sys.modules.get("torchmetrics")
    return tm is not None and isinstance(obj, tm.Metric)


class TorchMetric(Metric):
    """A ``torchmetrics.Metric`` behind Paddle's metric protocol (made by the Trainer; see the module doc).

    ``name`` defaults to the class name in lower case (``BinaryF1Score`` -> ``"binaryf1score"``).

    Example::

        m = TorchMetric(torchmetrics.classification.BinaryAUROC(), name="auroc")
        m.update(torch.tensor([0.2, 0.8]), torch.tensor([0, 1])); m.accumulate()   # 1.0
    """

    def __init__(self, metric: Any, name: str | None = None) -> None:
        super().__init__()
        self.metric = metric
        self._name = name or re.sub(r"[^a-z0-9_]", "", type(metric).__name__.lower())
        self._sync = False  # set by reduce_sums when the data is split across ranks
        self._group = None  # the data group's process group (Note [data group]); None: the world

    def compute(self, *args):
        return args

    def update(self, preds: Any, target: Any, *args) -> None:
        self.metric.to(preds.device if hasattr(preds, "device") else "cpu")
        self.metric.update(preds, target, *args)

    def reset(self) -> None:
        self.metric.reset()
        self._sync = False

    def accumulate_tensor(self) -> list:
        return []  # no per-batch value (see the module docstring)

    def accumulate(self) -> float | list[float]:
        self.metric.sync_on_compute = self._sync
        # compute() reads _to_sync, which torchmetrics copies from sync_on_compute only at construction: without
        # this, every rank's states were gathered even when each rank holds the whole data (counts doubled)
        self.metric._to_sync = self._sync
        self.metric.process_group = self._group  # tensor-parallel / pipeline replicas are not gathered twice
        self.metric._computed = None  # the sync choice may have changed since the last compute
        value = self.metric.compute()
        if hasattr(value, "numel") and value.numel() == 1:
            return float(value)
        return value.tolist() if hasattr(value, "tolist") else value

    def name(self) -> str:
        return self._name

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.metric.load_state_dict(state["metric"])
