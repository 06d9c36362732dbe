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
    m.update(m.compute(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1])))
    print(m.name(), m.accumulate())   # ['acc_top1', 'acc_top2'] [0.5, 1.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["Metric", "Accuracy", "MetricReductionError", "reduce_sums"]


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


class Accuracy(Metric):
    """Top-k classification accuracy (Paddle's ``paddle.metric.Accuracy``).

    ``compute(pred, label)`` takes logits/probabilities ``(N, C)`` and labels
    ``(N,)`` or ``(N, 1)``; ``accumulate()`` returns a float for a single
    ``k`` and a list for several. State: correct counts per ``k`` and the
    number of samples (exact integers, summed across ranks).

    Example::

        m = Accuracy()
        correct = m.compute(torch.tensor([[2.0, 1.0], [0.0, 3.0]]), torch.tensor([0, 0]))
        m.update(correct)
        assert m.accumulate() == 0.5 and m.name() == ["acc"]
    """

    def __init__(self, topk: Sequence[int] = (1,), name: str | None = None) -> None:
        super().__init__()
        topk = tuple(int(k) for k in (topk if isinstance(topk, (list, tuple)) else (topk,)))
        if not topk or any(k < 1 for k in topk):
            raise ValueError(f"Accuracy(topk={topk!r}): every k must be a positive integer, e.g. topk=(1, 5)")
        self.topk = topk
        self.maxk = max(topk)
        base = name or "acc"
        self._names = [f"{base}_top{k}" for k in topk] if self.maxk != 1 else [base]
        self.add_state("correct", torch.zeros(len(topk), dtype=torch.float64))
        self.add_state("count", torch.zeros((), dtype=torch.float64))

    def compute(self, pred: torch.Tensor, label: torch.Tensor, *args) -> torch.Tensor:
        if pred.dim() < 2:
            raise ValueError(f"Accuracy expects predictions of shape (N, C), got {tuple(pred.shape)}")
        if pred.shape[-1] < self.maxk:
            raise ValueError(f"Accuracy(topk={self.topk}) needs at least {self.maxk} classes, "
                             f"but predictions have {pred.shape[-1]}")
        label = label.reshape(-1) if label.dim() > 1 and label.shape[-1] == 1 else label
        if label.dim() > 1:  # one-hot or soft labels
            label = label.argmax(-1)
        top = pred.reshape(-1, pred.shape[-1]).topk(self.maxk, dim=-1).indices
        return (top == label.reshape(-1, 1).to(top.device)).to(torch.float32)

    def update(self, correct: torch.Tensor, *args) -> torch.Tensor:
        """Add a batch; returns the batch's accuracy per k (a tensor on the batch's device, no sync).

        The sums stay on the batch's device until they are read or reduced.
        """
        correct = correct.detach()
        n = correct.shape[0]
        sums = torch.stack([correct[:, :k].sum() for k in self.topk]).to(torch.float64)
        self.correct = self.correct.to(sums.device) + sums
        self.count = self.count.to(sums.device) + n
        accs = sums / max(n, 1)
        return accs[0] if len(self.topk) == 1 else accs

    def accumulate_tensor(self) -> torch.Tensor:
        accs = self.correct / self.count.clamp(min=1)
        return accs[0] if len(self.topk) == 1 else accs

    def accumulate(self) -> float | list[float]:
        accs = (self.correct / self.count.clamp(min=1)).tolist()
        return accs[0] if len(self.topk) == 1 else accs

    def name(self) -> list[str]:
        return list(self._names)


def reduce_sums(metrics: Sequence[Metric], extra: torch.Tensor | None = None) -> torch.Tensor | None:
    """Sum every metric's registered state (and ``extra``, a float64 vector) across ranks, in place.

    One all-reduce of one flat float64 tensor per call; a no-op without a
    process group. Returns the reduced ``extra``.
    """
    from ..distributed import collective

    if not collective.is_initialized() or collective.get_world_size() == 1:
        return extra
    parts: list[torch.Tensor] = []
    for m in metrics:
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
    flat = flat.to(collective.collective_device(flat.device))  # gloo takes the CPU sums (Note [per-device backends])
    collective.all_reduce(flat)
    flat = flat.cpu()
    offset = 0
    for m in metrics:
        for n in m.state_names():
            cur = getattr(m, n)
            setattr(m, n, flat[offset:offset + cur.numel()].reshape(cur.shape).to(cur.dtype))
            offset += cur.numel()
    if extra is not None:
        return flat[offset:offset + extra.numel()].reshape(extra.shape)
    return extra
