"""Metrics with Paddle's interface and exact distributed reduction.

A metric keeps its state as *sums* registered with :meth:`Metric.add_state`
(counts of correct samples, number of samples, ...). Across ranks the states
are summed, never averaged, and the Trainer feeds only the real samples of a
batch (padding added by the distributed sampler is cut off first), so a
distributed ``evaluate`` counts every sample of the data set exactly once and
equals the single-process result.

Paddle's protocol is kept: ``compute(*outputs, *labels)`` runs on the batch
tensors and returns what ``update`` takes; ``accumulate()`` returns the value;
``name()`` the names; ``reset()`` clears the state.

Example::

    import torch
    from fleetlite.trainer.metrics import Accuracy  # also fleetlite.metric.Accuracy

    m = Accuracy(topk=(1, 2))
    print(m.update(m.compute(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))))  # [0.5, 1.0]
    print(m.name(), m.accumulate())   # ['acc_top1', 'acc_top2'] [0.5, 1.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["Metric", "Accuracy", "MetricReductionError", "reduce_sums", "as_tensor"]


class MetricReductionError(RuntimeError):
    """A metric cannot be reduced exactly across ranks."""


class Metric:
    """Base class of metrics (Paddle's ``paddle.metric.Metric`` interface).

    Subclasses register their summable state in ``__init__`` with
    :meth:`add_state` and implement ``update``/``accumulate``/``name``;
    ``reset`` and the cross-rank reduction come for free.

    Example::

        class MeanAbsError(Metric):
            def __init__(self):
                super().__init__()
                self.add_state("abs_sum", torch.zeros((), dtype=torch.float64))
                self.add_state("count", torch.zeros((), dtype=torch.float64))

            def update(self, pred, label):
                self.abs_sum += (pred.flatten() - label.flatten()).abs().sum().double().cpu()  # or keep on device
                self.count += label.numel()

            def accumulate(self):
                return (self.abs_sum / self.count.clamp(min=1)).item()

            def name(self):
                return "mae"
    """

    def __init__(self) -> None:
        self._state_defaults: dict[str, torch.Tensor] = {}

    # -- state ---------------------------------------------------------------
    def add_state(self, name: str, default: torch.Tensor) -> None:
        """Register a state tensor that is summed across ranks; ``reset`` restores ``default``."""
        if not isinstance(default, torch.Tensor):
            raise TypeError(f"{type(self).__name__}.add_state({name!r}, ...): the default must be a torch.Tensor "
                            f"(got {type(default).__name__}); use e.g. torch.zeros((), dtype=torch.float64)")
        if "_state_defaults" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.add_state called before Metric.__init__; "
                               "call super().__init__() first in your __init__")
        self._state_defaults[name] = default.detach().clone().cpu()
        setattr(self, name, default.detach().clone().cpu())

    def state_names(self) -> list[str]:
        """Names of the registered (summable) states."""
        return list(self.__dict__.get("_state_defaults", {}))

    def reset(self) -> None:
        """Clear the state (registered states back to their defaults)."""
        for name, default in self.__dict__.get("_state_defaults", {}).items():
            setattr(self, name, default.clone())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The registered states (CPU tensors, checkpoint-safe)."""
        return {n: getattr(self, n).detach().cpu().clone() for n in self.state_names()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.state_names()) - set(state)
        if missing:
            raise KeyError(f"state of metric {type(self).__name__} lacks {sorted(missing)}; "
                           "was it saved by a different metric class?")
        for n in self.state_names():
            setattr(self, n, state[n].detach().clone().cpu())

    # -- Paddle's protocol ---------------------------------------------------
    def compute(self, *args):
        """Per-batch preprocessing on tensors; its result is passed to :meth:`update`. Default: identity."""
        return args

    def update(self, *args):
        raise NotImplementedError(f"{type(self).__name__} must implement update(*args)")

    def accumulate(self):
        raise NotImplementedError(f"{type(self).__name__} must implement accumulate()")

    def name(self):
        raise NotImplementedError(f"{type(self).__name__} must implement name()")

    def accumulate_tensor(self):
        """Like :meth:`accumulate`, but may return device tensors so that per-batch logs need no device sync.

        The Trainer uses it for the running values it passes to batch hooks; the default calls ``accumulate``.
        """
        return self.accumulate()

    def names(self) -> list[str]:
        """``name()`` as a list."""
        n = self.name()
        return [n] if isinstance(n, str) else list(n)


def as_tensor(x: Any, what: str = "input") -> torch.Tensor:
    """``x`` as a tensor: torch tensors are kept (detached), numpy arrays/scalars converted (Paddle accepts both)."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (np.ndarray, np.generic)):
        return torch.from_numpy(np.asarray(x))
    raise ValueError(f"{what} must be a numpy ndarray or a torch.Tensor, got {type(x).__name__}")


class PerK(list):
    """Paddle's per-k list (``Accuracy.total``/``count``); ``.item()`` gives the value when every k shares it."""

    def item(self):
        if len(set(self)) != 1:
            raise ValueError(f"the per-k values {list(self)} differ; index them (e.g. [0]) instead of .item()")
        return self[0]


class Accuracy(Metric):
    """Top-k classification accuracy (Paddle's ``paddle.metric.Accuracy``), exact across ranks.

    ``compute(pred, label)`` takes scores ``(N, ..., C)`` and labels ``(N,)``,
    ``(N, ..., 1)`` or one-hot ``(N, ..., C)`` and returns the correct mask
    ``(N, ..., maxk)`` (leading dimensions kept, as Paddle); ``update(correct)``
    accepts that mask as a tensor or a numpy array and returns the batch
    accuracy (a float, or a list with one per k); ``accumulate()`` the running
    value(s). ``total``/``count`` are per-k lists, as in Paddle.

    **Single-column predictions** (``C == 1``: a sigmoid or ``BCEWithLogitsLoss``
    model). Paddle takes the top-1 of one column, which is always column 0, so
    perfect predictions score the fraction of label-0 samples (0.5 on balanced
    data) - a plausible, wrong number. fleetlite computes *binary accuracy*
    instead, as Keras' ``"accuracy"`` does for one output column: a sample is
    predicted positive when ``pred > threshold`` (Keras' ``BinaryAccuracy``) and
    compared with ``label > 0.5``. ``threshold`` defaults to 0.5 for
    probabilities; with logits pass ``threshold=0.0``. Without an explicit
    threshold, values outside ``[0, 1]`` (logits) raise a ValueError rather than
    being thresholded at 0.5. ``topk`` above 1 with one column is an error.

    Example::

        m = Accuracy()
        correct = m.compute(torch.tensor([[2.0, 1.0], [0.0, 3.0]]), torch.tensor([0, 0]))
        assert m.update(correct) == 0.5 and m.accumulate() == 0.5 and m.name() == ["acc"]
        b = Accuracy(threshold=0.0)   # one logit column
        b.update(b.compute(torch.tensor([[2.0], [-1.0]]), torch.tensor([[1.0], [0.0]])))
        assert b.accumulate() == 1.0
    """

    def __init__(self, topk: int | Sequence[int] = (1,), name: str | None = None, *args,
                 threshold: float | None = None, **kwargs) -> None:
        super().__init__()
        topk = tuple(int(k) for k in (topk if isinstance(topk, (list, tuple)) else (topk,)))
        if not topk or any(k < 1 for k in topk):
            raise ValueError(f"Accuracy(topk={topk!r}): every k must be a positive integer, e.g. topk=(1, 5)")
        self.topk = topk
        self.maxk = max(topk)
        self.threshold = threshold
        base = name or "acc"
        self._names = [f"{base}_top{k}" for k in topk] if self.maxk != 1 else [base]
        self.add_state("_total", torch.zeros(len(topk), dtype=torch.float64))
        self.add_state("_count", torch.zeros(len(topk), dtype=torch.float64))

    @property
    def total(self) -> list[float]:
        """Correct predictions per k (Paddle's ``Accuracy.total``)."""
        return PerK(self._total.tolist())

    @property
    def count(self) -> list[int]:
        """Samples counted per k (Paddle's ``Accuracy.count``; ``count.item()``: the samples, same for every k)."""
        return PerK(int(c) for c in self._count.tolist())

    def compute(self, pred: Any, label: Any, *args) -> torch.Tensor:
        pred, label = as_tensor(pred, "pred"), as_tensor(label, "label").to(as_tensor(pred).device)
        if pred.dim() < 1:
            raise ValueError(f"Accuracy expects predictions of shape (N, C), got {tuple(pred.shape)}")
        if pred.shape[-1] == 1:
            return self._binary(pred, label)
        if pred.shape[-1] < self.maxk:
            raise ValueError(f"Accuracy(topk={self.topk}) needs at least {self.maxk} classes, "
                             f"but predictions have {pred.shape[-1]}")
        top = pred.topk(self.maxk, dim=-1).indices
        if label.dim() == 1 or (label.dim() == 2 and label.shape[-1] == 1):
            label = label.reshape(-1, 1)
        elif label.shape[-1] != 1:  # one-hot or soft labels
            label = label.argmax(-1, keepdim=True)
        return (top == label.to(top.device)).to(torch.float32)

    def _binary(self, pred: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        if self.maxk > 1:
            raise ValueError(f"Accuracy(topk={self.topk}) on single-column predictions {tuple(pred.shape)}: top-k "
                             "needs k classes; with one (binary) column use Accuracy() (binary accuracy)")
        if label.numel() != pred.numel():
            raise ValueError(f"Accuracy on single-column predictions {tuple(pred.shape)} needs one binary label per "
                             f"sample, got labels of shape {tuple(label.shape)}")
        threshold = self.threshold
        if threshold is None:
            lo, hi = pred.aminmax() if pred.numel() else (pred.new_zeros(()), pred.new_zeros(()))
            if lo.item() < 0.0 or hi.item() > 1.0:
                raise ValueError(
                    f"Accuracy on single-column predictions: values range over [{lo.item():.4g}, {hi.item():.4g}], "
                    "so they are logits, not probabilities; thresholding them at 0.5 would give a wrong accuracy. "
                    "Pass Accuracy(threshold=0.0) for logits (or apply a sigmoid in the model)")
            threshold = 0.5
        positive = pred > threshold
        return (positive == (label.reshape(pred.shape) > 0.5)).to(torch.float32)

    def _update_lazy(self, correct: Any, *args) -> None:
        """``update`` without reading the result back (no device sync; the Trainer's per-batch path)."""
        correct = as_tensor(correct, "correct")
        n = correct[..., 0].numel() if correct.dim() else 1
        sums = torch.stack([correct[..., :k].sum() for k in self.topk]).to(torch.float64)
        self._total = self._total.to(sums.device, non_blocking=True) + sums  # the epoch's first batch: no sync
        self._count = self._count.to(sums.device, non_blocking=True) + n
        return sums, n

    def update(self, correct: Any, *args) -> float | list[float]:
        """Add a batch's correct mask (tensor or numpy); returns the batch accuracy (list for several k)."""
        sums, n = self._update_lazy(correct)
        accs = [float(s) / n if n else 0.0 for s in sums.tolist()]
        return accs[0] if len(self.topk) == 1 else accs

    def accumulate_tensor(self) -> torch.Tensor:
        accs = self._total / self._count.clamp(min=1)
        return accs[0] if len(self.topk) == 1 else accs

    def accumulate(self) -> float | list[float]:
        accs = [t / c if c > 0 else 0.0 for t, c in zip(self._total.tolist(), self._count.tolist())]
        return accs[0] if len(self.topk) == 1 else accs

    def name(self) -> list[str]:
        return list(self._names)


def reduce_sums(metrics: Sequence[Metric], extra: torch.Tensor | None = None) -> torch.Tensor | None:
    """Sum every metric's registered state (and ``extra``, a float64 vector) across the data group, in place.

    The data group is the world, or under tensor/pipeline parallelism the data-parallel group (Note [data
    group] in :mod:`fleetlite.distributed.fleet.data_group`: the ranks of one model replica saw the same
    samples, so they are not added). One all-reduce of one flat float64 tensor per call; a no-op without a
    process group. Returns the reduced ``extra``.
    """
    from ..distributed import collective
    from ..distributed.fleet.data_group import data_group

    g = data_group()
    if not collective.is_initialized() or g.size == 1:
        return extra
    parts: list[torch.Tensor] = []
    for m in metrics:
        if hasattr(m, "_sync"):  # a torchmetrics metric: it gathers its own states in compute()
            m._sync, m._group = True, g.group
            continue
        if not m.state_names():
            raise MetricReductionError(
                f"metric {type(m).__name__} ({m.names()}) registers no summable state, so it cannot be combined "
                "exactly across ranks (averaging per-rank values would be wrong). Register its counts in "
                "__init__ with self.add_state('name', torch.zeros(...)) and update them in update().")
        parts.extend(getattr(m, n).reshape(-1).to(torch.float64).cpu() for n in m.state_names())
    if extra is not None:
        parts.append(extra.reshape(-1).to(torch.float64).cpu())
    if not parts:
        return extra
    flat = torch.cat(parts)
    # gloo takes the CPU sums (Note [per-device backends])
    flat = flat.to(collective.collective_device(flat.device, g.group))
    collective.all_reduce(flat, group=g.group)
    flat = flat.cpu()
    offset = 0
    for m in metrics:
        if hasattr(m, "_sync"):
            continue
        for n in m.state_names():
            cur = getattr(m, n)
            setattr(m, n, flat[offset:offset + cur.numel()].reshape(cur.shape).to(cur.dtype))
            offset += cur.numel()
    if extra is not None:
        return flat[offset:offset + extra.numel()].reshape(extra.shape)
    return extra
