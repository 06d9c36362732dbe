"""One view of whatever data the Trainer is given: a Dataset, a DataLoader, a TensorLoader, tensors.

A :class:`DataAdapter` offers what the loops need and nothing else: batches,
``len()`` of the current pass, ``set_epoch``, ``num_valid(i)`` (real samples
of local batch ``i``, the rest being padding), the position for checkpoints,
whether the data is split across ranks, and the dataset indices of each
batch (for ``predict`` in dataset order).

* Dataset (or a tuple of tensors): wrapped in a
  :class:`~fleetlite.io.DistributedBatchSampler` + ``DataLoader``.
* ``DataLoader`` driven by a ``DistributedBatchSampler`` and
  :class:`~fleetlite.io.TensorLoader`: used as they are, with their sampler's
  cursor for positions and padding.
* ``DataLoader`` with torch's ``DistributedSampler``: its padding is
  computed from torch's interleaved layout, so evaluation is still exact.
* A plain ``DataLoader`` (sequential or shuffled) on several ranks: rebuilt
  over a ``DistributedBatchSampler`` with the same batch size, shuffle and
  drop_last (as Lightning does), so each rank takes its share.
* Any other loader: used as is; it is taken to hold the *whole* data on every
  rank (not sharded; a warning says so on several ranks), and mid-epoch
  resume replays it (Note [resume replay] in :mod:`fleetlite.trainer.state`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

__all__ = ["DataAdapter", "batch_length", "to_device", "keras_xy", "keras_evaluate_args", "describe_sizes"]


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


def describe_sizes(adapter: DataAdapter) -> str:
    """``"5 samples, batch size 8 per rank, 1 rank, drop_last=True"`` (what is known of them)."""
    owner = adapter.sampler if adapter.sampler is not None else adapter.loader
    parts = []
    for obj in (owner, getattr(owner, "dataset", None), adapter.loader):
        dataset = getattr(obj, "dataset", None)
        if dataset is not None and hasattr(dataset, "__len__"):
            parts.append(f"{len(dataset)} samples")
            break
    bs = getattr(owner, "batch_size", None) or getattr(adapter.loader, "batch_size", None)
    if bs:
        parts.append(f"batch size {bs} per rank")
    ranks = getattr(owner, "nranks", None) or getattr(owner, "num_replicas", None) or 1
    parts.append(f"{ranks} rank{'s' if ranks != 1 else ''}")
    drop = getattr(owner, "drop_last", getattr(adapter.loader, "drop_last", None))
    if drop is not None:
        parts.append(f"drop_last={drop}")
    return ", ".join(parts)


def _split_plain_loader(loader: DataLoader, seed: int, role: str) -> DataLoader | None:
    """On several ranks, the same loader over a ``DistributedBatchSampler`` (Lightning does the same).

    A plain ``DataLoader`` (sequential or shuffled, no distributed sampler) would otherwise give every rank
    the whole data: each sample trained once per rank. Loaders with another sampler are kept as they are,
    with a warning (once) that every rank reads all of it.
    """
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    from ..distributed import collective
    from ..io.sampler import DistributedBatchSampler
    from ..utils.user_warning import warn_once

    if collective.get_world_size() == 1 or not collective.is_initialized():
        return None
    plain = (type(loader.batch_sampler) is BatchSampler and type(loader.sampler) in (SequentialSampler, RandomSampler)
             and not isinstance(loader.dataset, torch.utils.data.IterableDataset))
    if not plain:
        warn_once(f"unsplit-{role}", f"fleetlite: the {role} DataLoader has a custom sampler and no distributed "
                                     f"one, so each of the {collective.get_world_size()} ranks reads all of it; "
                                     "give it a fleetlite.io.DistributedBatchSampler (or torch's "
                                     "DistributedSampler) to split it across ranks")
        return None
    sampler = DistributedBatchSampler(loader.dataset, loader.batch_size, shuffle=isinstance(loader.sampler,
                                      RandomSampler), drop_last=loader.drop_last, seed=seed)
    kwargs = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                  timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                  multiprocessing_context=loader.multiprocessing_context)
    if loader.num_workers > 0:
        kwargs.update(prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers)
    return DataLoader(loader.dataset, batch_sampler=sampler, **kwargs)


def _is_tensor_pipeline(data: Any) -> bool:
    return all(hasattr(data, a) for a in ("batch_sampler", "set_epoch", "num_valid", "state_dict")) \
        and not isinstance(data, DataLoader)


class DataAdapter:
    """Uniform access to training/evaluation/prediction data (see the module docstring).

    Example::

        adapter = DataAdapter.build(dataset, batch_size=32, shuffle=True)
        adapter.set_epoch(0)
        for i, batch in enumerate(adapter):
            n_real = adapter.num_valid(i)
    """

    def __init__(self, loader: Any, sampler: Any = None, sharded: bool = False, kind: str = "loader") -> None:
        self.loader = loader
        self.sampler = sampler  # a DistributedBatchSampler (cursor, padding), when one drives the loader
        self.sharded = sharded
        self.kind = kind

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def build(cls, data: Any, batch_size: int = 32, shuffle: bool = False, drop_last: bool = False,
              num_workers: int = 0, seed: int = 0, pin_memory: bool = False, role: str = "train") -> DataAdapter:
        from ..io.evaluation import find_batch_sampler
        from ..io.sampler import DistributedBatchSampler

        if data is None:
            raise ValueError(f"no {role} data given")
        if isinstance(data, DataAdapter):
            return data
        if isinstance(data, (tuple, list)) and data and all(isinstance(t, torch.Tensor) for t in data):
            lengths = {int(t.shape[0]) for t in data}
            if len(lengths) != 1:
                raise ValueError(f"{role} data given as tensors must share their first dimension, got "
                                 f"{[tuple(t.shape) for t in data]}")
            data = TensorDataset(*data)
        if _is_tensor_pipeline(data):
            return cls(data, data.batch_sampler, data.batch_sampler.nranks > 1, "pipeline")
        if isinstance(data, DataLoader):
            bs = find_batch_sampler(data)
            if bs is not None:
                return cls(data, bs, bs.nranks > 1, "loader")
            if isinstance(data.sampler, DistributedSampler):
                return cls(data, None, data.sampler.num_replicas > 1, "torch_distributed")
            split = _split_plain_loader(data, seed, role)
            if split is not None:
                return cls(split, split.batch_sampler, True, "loader")
            return cls(data, None, False, "loader")
        if isinstance(data, Dataset) or (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            if isinstance(data, torch.utils.data.IterableDataset):
                raise TypeError("an IterableDataset cannot be split into per-rank batches by the Trainer; pass a "
                                "DataLoader over it instead (each rank must then yield its own share)")
            if not isinstance(batch_size, int) or batch_size < 1:
                raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
            sampler = DistributedBatchSampler(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
            loader = DataLoader(data, batch_sampler=sampler, num_workers=num_workers, pin_memory=pin_memory)
            return cls(loader, sampler, sampler.nranks > 1, "dataset")
        if hasattr(data, "__iter__"):
            return cls(data, None, False, "loader")
        raise TypeError(f"cannot use {type(data).__name__} as {role} data: pass a Dataset, a DataLoader, a "
                        "fleetlite.io.TensorLoader or a tuple of tensors")

    # -- iteration -----------------------------------------------------------------------------------------------
    def __iter__(self):
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def length(self) -> int | None:
        """``len()`` of the current/next pass, or None when the loader has no length."""
        try:
            return len(self.loader)
        except TypeError:
            return None

    def set_epoch(self, epoch: int) -> None:
        if self.kind == "pipeline":
            self.loader.set_epoch(epoch)
        elif self.sampler is not None:
            self.sampler.set_epoch(epoch)
        else:
            inner = getattr(self.loader, "sampler", None)
            if hasattr(inner, "set_epoch"):
                inner.set_epoch(epoch)

    # -- padding -------------------------------------------------------------------------------------------------
    def num_valid(self, index: int, batch: Any = None) -> int | None:
        """Leading real samples of local batch ``index`` of the current pass (None: all are real)."""
        if self.sampler is not None:
            return self.sampler.num_valid(index)
        if self.kind == "torch_distributed":
            s = self.loader.sampler
            if s.drop_last:
                return None
            bs = self.loader.batch_size
            # torch's layout: local sample j of rank r is position r + j*R of the padded list, real if < N
            real_local = max(0, math.ceil((len(s.dataset) - s.rank) / s.num_replicas))
            n = batch_length(batch) if batch is not None else bs
            return max(0, min(n, real_local - index * bs))
        return None

    def exact_reason(self) -> str | None:
        """Why evaluation over this data could not be exact (None when it is)."""
        if self.sampler is not None and self.sampler.drop_last:
            return ("its sampler drops the last incomplete batch (drop_last=True), so some samples are never "
                    "evaluated; use drop_last=False for evaluation data")
        if self.kind == "torch_distributed" and self.loader.sampler.drop_last:
            return "its DistributedSampler has drop_last=True, so some samples are never evaluated"
        if self.kind == "loader" and getattr(self.loader, "drop_last", False):
            return ("the DataLoader drops the last incomplete batch (drop_last=True), so some samples are never "
                    "evaluated; use drop_last=False for evaluation data")
        return None

    # -- position ------------------------------------------------------------------------------------------------
    @property
    def resumable(self) -> bool:
        """True when the position can be saved and restored without replaying batches."""
        return self.sampler is not None

    def position(self, consumed: int) -> dict[str, Any] | None:
        """The position after ``consumed`` local batches of the current pass (plain values)."""
        if self.kind == "pipeline":
            return self.loader.state_dict(consumed=consumed)
        if self.sampler is not None:
            return self.sampler.state_dict(consumed=consumed)
        return None

    def load_position(self, state: dict[str, Any]) -> None:
        if self.kind == "pipeline":
            self.loader.load_state_dict(state)
        elif self.sampler is not None:
            self.sampler.load_state_dict(state)

    # -- indices (predict) ---------------------------------------------------------------------------------------
    def pass_indices(self) -> list[list[int]] | None:
        """Dataset indices of each local batch of the next pass, without moving the data's position."""
        if self.sampler is not None:
            saved = self.sampler.state_dict()
            try:
                return [list(map(int, b)) for b in self.sampler]
            finally:
                self.sampler.load_state_dict(saved)
        if self.kind == "torch_distributed":
            idx = list(self.loader.sampler)
            bs = self.loader.batch_size
            return [idx[i:i + bs] for i in range(0, len(idx), bs)]
        return None
