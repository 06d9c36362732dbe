"""Paddle's binary metrics ``Precision``, ``Recall`` and ``Auc``, with Paddle's numbers and exact cross-rank sums.

Public through :mod:`fleetlite.metric`. Each keeps its state as sums
(true/false positive counts, the ROC histogram), so the Trainer adds them
across ranks (padding excluded) and a distributed evaluation equals a
single-process one exactly.

Paddle's rounding is kept so the numbers are Paddle's: ``Precision`` counts a
prediction as positive when ``floor(p + 0.5) == 1`` (``p >= 0.5``),
``Recall`` when ``rint(p) == 1`` (``p > 0.5``: ``rint`` rounds 0.5 to 0).

Example::

    import numpy as np
    from fleetlite.metric import Precision, Recall, Auc

    p = Precision(); p.update(np.array([0.1, 0.5, 0.6, 0.7]), np.array([0, 1, 1, 1]))
    assert p.accumulate() == 1.0
    a = Auc(); a.update(np.array([[0.8, 0.2], [0.3, 0.7]]), np.array([[0], [1]]))
    assert a.accumulate() == 1.0
"""

from __future__ import annotations

from typing import Any

import torch

from .metrics import Metric, as_tensor

__all__ = ["Precision", "Recall", "Auc"]


def _binary_column(preds: Any, labels: Any, who: str) -> tuple[torch.Tensor, torch.Tensor]:
    preds, labels = as_tensor(preds, "preds"), as_tensor(labels, "labels")
    n = labels.shape[0] if labels.dim() else 1
    if preds.numel() != n or labels.numel() != n:
        raise ValueError(f"{who} is a binary metric: it needs one probability and one 0/1 label per sample, shapes "
                         f"(N,) or (N, 1); got preds {tuple(preds.shape)} and labels {tuple(labels.shape)}")
    return preds.reshape(-1), labels.reshape(-1).to(preds.device)


class Precision(Metric):
    """Binary precision ``tp / (tp + fp)`` (Paddle's ``paddle.metric.Precision``).

    ``update(preds, labels)``: probabilities of the positive class and 0/1
    labels, shapes ``(N,)`` or ``(N, 1)``, numpy or tensors. A prediction is
    positive when ``floor(p + 0.5) == 1`` (Paddle's rule: ``0.5 <= p < 1.5``).

    Example::

        m = Precision()
        m.update(np.array([0.1, 0.5, 0.6, 0.7]), np.array([1, 0, 1, 1]))
        assert abs(m.accumulate() - 2 / 3) < 1e-12 and m.name() == "precision"
    """

    def __init__(self, name: str = "precision", *args, **kwargs) -> None:
        super().__init__()
        self._name = name
        self.add_state("_tp", torch.zeros((), dtype=torch.float64))
        self._fp_state()

    def _fp_state(self) -> None:
        self.add_state("_fp", torch.zeros((), dtype=torch.float64))

    @property
    def tp(self) -> int:
        return int(self._tp)

    @property
    def fp(self) -> int:
        return int(self._fp)

    def _update_lazy(self, preds: Any, labels: Any) -> None:
        p, y = _binary_column(preds, labels, "Precision")
        positive = torch.floor(p.to(torch.float64) + 0.5) == 1
        hit = (y == 1)
        self._tp = self._tp.to(p.device) + (positive & hit).sum(dtype=torch.float64)
        self._fp = self._fp.to(p.device) + (positive & ~hit).sum(dtype=torch.float64)

    def update(self, preds: Any, labels: Any) -> None:
        self._update_lazy(preds, labels)

    def accumulate_tensor(self) -> torch.Tensor:
        return self._tp / (self._tp + self._fp).clamp(min=1)

    def accumulate(self) -> float:
        ap = float(self._tp + self._fp)
        return float(self._tp) / ap if ap != 0 else 0.0

    def name(self) -> str:
        return self._name


class Recall(Precision):
    """Binary recall ``tp / (tp + fn)`` (Paddle's ``paddle.metric.Recall``).

    Same inputs as :class:`Precision`; a prediction is positive when
    ``rint(p) == 1`` (Paddle's rule: ``0.5 < p < 1.5``, 0.5 rounds to 0).

    Example::

        m = Recall()
        m.update(np.array([0.1, 0.5, 0.6, 0.7]), np.array([1, 0, 1, 1]))
        assert abs(m.accumulate() - 2 / 3) < 1e-12 and m.name() == "recall"
    """

    def __init__(self, name: str = "recall", *args, **kwargs) -> None:
        super().__init__(name)

    def _fp_state(self) -> None:
        self.add_state("_fn", torch.zeros((), dtype=torch.float64))

    @property
    def fp(self) -> int:  # pragma: no cover - Recall has no false-positive count
        raise AttributeError("Recall counts tp and fn, not fp")

    @property
    def fn(self) -> int:
        return int(self._fn)

    def _update_lazy(self, preds: Any, labels: Any) -> None:
        p, y = _binary_column(preds, labels, "Recall")
        positive = torch.round(p.to(torch.float64)) == 1  # round half to even, as numpy's rint
        actual = (y == 1)
        self._tp = self._tp.to(p.device) + (positive & actual).sum(dtype=torch.float64)
        self._fn = self._fn.to(p.device) + (~positive & actual).sum(dtype=torch.float64)

    def accumulate_tensor(self) -> torch.Tensor:
        return self._tp / (self._tp + self._fn).clamp(min=1)

    def accumulate(self) -> float:
        total = float(self._tp + self._fn)
        return float(self._tp) / total if total != 0 else 0.0


class Auc(Metric):
    """Area under the ROC curve from Paddle's histogram (``paddle.metric.Auc``), equal to Paddle's numbers.

    Each sample's positive-class probability ``p`` goes to bucket
    ``int(p * num_thresholds)`` of a positive or negative histogram (computed in
    the probabilities' own dtype, as Paddle's numpy code); ``accumulate()``
    integrates the ROC curve over the buckets with the trapezoid rule. The
    histograms are counts, so the sum over ranks is exact.

    ``update(preds, labels)``: ``preds`` ``(N, 2)`` class probabilities (column
    1 is used, as Paddle) - fleetlite also takes ``(N,)``/``(N, 1)`` positive
    probabilities; ``labels`` ``(N,)``/``(N, 1)``, nonzero = positive.
    Probabilities outside ``[0, 1]`` raise (Paddle would index a wrong bucket).
    Only ``curve='ROC'`` is implemented (as in Paddle).

    Example::

        m = Auc()
        x = np.array([[0.78, 0.22], [0.62, 0.38], [0.55, 0.45], [0.30, 0.70],
                      [0.14, 0.86], [0.59, 0.41], [0.91, 0.08], [0.16, 0.84]])
        m.update(x, np.array([[0], [1], [1], [0], [1], [0], [0], [1]]))
        assert abs(m.accumulate() - 0.8125) < 1e-12
    """

    def __init__(self, curve: str = "ROC", num_thresholds: int = 4095, name: str = "auc", *args, **kwargs) -> None:
        super().__init__()
        if curve != "ROC":
            raise ValueError(f"Auc(curve={curve!r}): only curve='ROC' is implemented (as in Paddle)")
        if not isinstance(num_thresholds, int) or num_thresholds < 1:
            raise ValueError(f"Auc(num_thresholds={num_thresholds!r}) must be a positive integer")
        self._curve = curve
        self._num_thresholds = num_thresholds
        self._name = name
        self.add_state("_stat_pos", torch.zeros(num_thresholds + 1, dtype=torch.float64))
        self.add_state("_stat_neg", torch.zeros(num_thresholds + 1, dtype=torch.float64))

    def _update_lazy(self, preds: Any, labels: Any) -> None:
        preds, labels = as_tensor(preds, "preds"), as_tensor(labels, "labels")
        n = labels.shape[0] if labels.dim() else 1
        if preds.dim() == 2 and preds.shape[1] == 2:
            p = preds[:, 1]
        elif preds.numel() == n:
            p = preds.reshape(-1)
        else:
            raise ValueError(f"Auc needs preds of shape (N, 2) (class probabilities) or (N,)/(N, 1) (positive "
                             f"probability) for {n} labels, got {tuple(preds.shape)}")
        if labels.numel() != n:
            raise ValueError(f"Auc needs one label per sample, shape (N,) or (N, 1), got {tuple(labels.shape)}")
        if not p.is_floating_point():
            p = p.to(torch.float64)
        if p.numel() and (p.min().item() < 0 or p.max().item() > 1):
            raise ValueError("Auc needs probabilities in [0, 1] (apply softmax/sigmoid to logits first); got values "
                             f"in [{p.min().item():.4g}, {p.max().item():.4g}]")
        bins = (p * self._num_thresholds).to(torch.int64)  # truncation, as Paddle's int(value * num_thresholds)
        pos = labels.reshape(-1).to(p.device) != 0
        size = self._num_thresholds + 1
        self._stat_pos = self._stat_pos.to(p.device) + torch.bincount(bins[pos], minlength=size).to(torch.float64)
        self._stat_neg = self._stat_neg.to(p.device) + torch.bincount(bins[~pos], minlength=size).to(torch.float64)

    def update(self, preds: Any, labels: Any) -> None:
        self._update_lazy(preds, labels)

    @staticmethod
    def trapezoid_area(x1: float, x2: float, y1: float, y2: float) -> float:
        return abs(x1 - x2) * (y1 + y2) / 2.0

    def _area(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Paddle walks the buckets from the highest threshold down; every term is a multiple of 0.5 of integer
        # counts, so the vectorised float64 sum is exact and equals Paddle's loop bit for bit
        pos = self._stat_pos.flip(0)
        neg = self._stat_neg.flip(0)
        cum_pos = torch.cumsum(pos, 0)
        prev_pos = cum_pos - pos
        area = (neg * (cum_pos + prev_pos) / 2.0).sum()
        return area, cum_pos[-1], neg.sum()

    def accumulate_tensor(self) -> torch.Tensor:
        area, tot_pos, tot_neg = self._area()
        return torch.where((tot_pos > 0) & (tot_neg > 0), area / tot_pos.clamp(min=1) / tot_neg.clamp(min=1),
                           torch.zeros_like(area))

    def accumulate(self) -> float:
        area, tot_pos, tot_neg = (float(v) for v in self._area())
        return area / tot_pos / tot_neg if tot_pos > 0.0 and tot_neg > 0.0 else 0.0

    def name(self) -> str:
        return self._name
