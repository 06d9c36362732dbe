"""``TensorAdapter``: in-memory tensors (``fit((x, y))``, a ``TensorDataset``), one gather per batch.

A ``DataLoader`` over a ``TensorDataset`` indexes each sample (``x[i]``, ``y[i]``) and stacks them again
(``default_collate``): about 0.55 ms for a batch of 64, half the step of a small model. Indexing each
tensor with the whole batch of indices at once (as :class:`~fleetlite.io.TensorLoader` does) gives the
same batches (same values, dtypes and order, as a list like the collated ones) in about 0.02 ms. The
indices come from the same :class:`~fleetlite.io.DistributedBatchSampler`, so the order, the padding and
the positions saved for a mid-epoch resume are those of the ``DataLoader`` path.

Tensors on one device (a GPU's, say) are indexed on that device: the sampler's order for the pass goes there
once (:meth:`~fleetlite.io.DistributedBatchSampler.device_batches`: one pinned, non-blocking copy per epoch)
and each batch's indices are a slice of it, so no index tensor is made on the host per batch and the host
never waits for the device to hand out a batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import TensorDataset

from ...io.sampler import DistributedBatchSampler
from .base import data_split
from .sampled import SampledAdapter

__all__ = ["TensorAdapter"]


class TensorAdapter(SampledAdapter):
    """Batches of in-memory tensors gathered with one index per batch (see the module docstring).

    ``num_workers`` does not apply (no per-sample work to spread); ``pin_memory`` pins each CPU batch.

    Example::

        adapter = TensorAdapter((x, y), batch_size=64, shuffle=True)
        adapter.set_epoch(0)
        for xb, yb in adapter:      # xb = x[idx], yb = y[idx] for this rank's idx of the batch
            pass
    """

    def __init__(self, tensors: Sequence[torch.Tensor], batch_size: int, shuffle: bool = False,
                 drop_last: bool = False, seed: int = 0, pin_memory: bool = False) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
        self.tensors = tuple(tensors)
        dataset = TensorDataset(*self.tensors)  # what the sampler and describe_sizes see
        sampler = DistributedBatchSampler(dataset, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed,
                                          **data_split())  # Note [data group]
        super().__init__(None, sampler)
        self.pin_memory = pin_memory

    def _gather(self, index: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for t in self.tensors:
            b = t[index if t.device == index.device else index.to(t.device)]
            if not b.is_contiguous():  # default_collate's stack returns contiguous tensors
                b = b.contiguous()
            if self.pin_memory and b.device.type == "cpu":
                b = b.pin_memory()
            out.append(b)
        return out

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        devices = {t.device for t in self.tensors}
        device = devices.pop() if len(devices) == 1 else torch.device("cpu")  # mixed: gathered from the CPU
        for index in self.sampler.device_batches(device):
            yield self._gather(index)

    def __len__(self) -> int:
        return len(self.sampler)

    @staticmethod
    def accepts(data: Any) -> bool:
        """In-memory tensors: a ``TensorDataset`` itself (not a subclass with its own ``__getitem__``)."""
        return type(data) is TensorDataset
