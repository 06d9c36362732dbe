"""Adapters of data driven by a :class:`~fleetlite.io.DistributedBatchSampler`: its cursor gives the position
(mid-epoch resume without replay, re-split over another world size) and its layout the padding.

* :class:`SampledAdapter`: a ``DataLoader`` whose ``batch_sampler`` is one (given so, or a map-style
  dataset wrapped by :func:`dataset_adapter`, or a plain loader rebuilt over one on several ranks).
* :class:`PipelineAdapter`: a :class:`~fleetlite.io.TensorLoader` (or any loader with the same protocol),
  which keeps the position itself (its augmentation depends on the epoch too).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from ...io.sampler import DistributedBatchSampler
from .base import DataAdapter, data_split

__all__ = ["SampledAdapter", "PipelineAdapter", "dataset_adapter", "is_tensor_pipeline"]


class SampledAdapter(DataAdapter):
    """A loader driven by a :class:`~fleetlite.io.DistributedBatchSampler` (see the module docstring).

    Example::

        sampler = DistributedBatchSampler(dataset, batch_size=32, shuffle=True)
        adapter = SampledAdapter(DataLoader(dataset, batch_sampler=sampler), sampler)
    """

    def __init__(self, loader: Any, sampler: DistributedBatchSampler) -> None:
        super().__init__(loader)
        self.sampler = sampler
        self.sharded = sampler.nranks > 1

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def num_valid(self, index: int, batch: Any = None) -> int | None:
        return self.sampler.num_valid(index)

    def exact_reason(self) -> str | None:
        if self.sampler.drop_last:
            return ("its sampler drops the last incomplete batch (drop_last=True), so some samples are never "
                    "evaluated; use drop_last=False for evaluation data")
        return None

    @property
    def resumable(self) -> bool:
        return True

    def position(self, consumed: int) -> dict[str, Any] | None:
        return self.sampler.state_dict(consumed=consumed)

    def load_position(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)

    def pass_indices(self) -> list[list[int]] | None:
        saved = self.sampler.state_dict()
        try:
            return [list(map(int, b)) for b in self.sampler]
        finally:
            self.sampler.load_state_dict(saved)


def dataset_adapter(data: Any, batch_size: int, shuffle: bool, drop_last: bool, num_workers: int, seed: int,
                    pin_memory: bool) -> SampledAdapter:
    """A map-style dataset: a ``DistributedBatchSampler`` over it drives a ``DataLoader`` (per-sample
    ``__getitem__`` and collation, in ``num_workers`` processes when asked)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    sampler = DistributedBatchSampler(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed,
                                      **data_split())  # Note [data group]
    return SampledAdapter(DataLoader(data, batch_sampler=sampler, num_workers=num_workers, pin_memory=pin_memory),
                          sampler)


def is_tensor_pipeline(data: Any) -> bool:
    """True for a :class:`~fleetlite.io.TensorLoader` or a loader with its protocol."""
    return all(hasattr(data, a) for a in ("batch_sampler", "set_epoch", "num_valid", "state_dict")) \
        and not isinstance(data, DataLoader)


class PipelineAdapter(SampledAdapter):
    """A :class:`~fleetlite.io.TensorLoader`: batches, padding and indices from its sampler; epoch and
    position through the loader itself.

    Example::

        adapter = PipelineAdapter(TensorLoader(images, labels, batch_size=256))
    """

    def __init__(self, loader: Any) -> None:
        super().__init__(loader, loader.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def position(self, consumed: int) -> dict[str, Any] | None:
        return self.loader.state_dict(consumed=consumed)

    def load_position(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
