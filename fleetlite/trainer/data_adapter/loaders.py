"""Adapters of ``DataLoader``s and other iterables that no ``DistributedBatchSampler`` of ours drives.

* :class:`TorchDistributedAdapter`: a ``DataLoader`` over torch's ``DistributedSampler``; its padding is
  computed from torch's interleaved layout (:func:`fleetlite.io.evaluation.torch_sampler_num_valid`, shared
  with :func:`~fleetlite.io.drop_padding`), so evaluation is still exact; resumed by replaying.
* :func:`split_plain_loader`: a plain ``DataLoader`` (sequential or shuffled) on several ranks is rebuilt
  over a ``DistributedBatchSampler`` with the same batch size, shuffle and drop_last (as Lightning does),
  so each rank takes its share (then a :class:`~.sampled.SampledAdapter`).
* Any other loader or iterable: :class:`~.base.DataAdapter` itself, taken to hold the *whole* data on
  every rank (not sharded; a warning says so on several ranks).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from ...distributed import collective
from ...io.evaluation import torch_sampler_num_valid
from ...io.sampler import DistributedBatchSampler
from ...utils.user_warning import warn_once
from .base import DataAdapter, data_split

__all__ = ["TorchDistributedAdapter", "split_plain_loader"]


class TorchDistributedAdapter(DataAdapter):
    """A ``DataLoader`` over torch's ``DistributedSampler`` (see the module docstring).

    Example::

        loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
        adapter = TorchDistributedAdapter(loader)
    """

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self.sharded = loader.sampler.num_replicas > 1

    def num_valid(self, index: int, batch: Any = None) -> int | None:
        s = self.loader.sampler
        return None if s.drop_last else torch_sampler_num_valid(s, self.loader.batch_size, index)

    def exact_reason(self) -> str | None:
        if self.loader.sampler.drop_last:
            return "its DistributedSampler has drop_last=True, so some samples are never evaluated"
        return None

    def pass_indices(self) -> list[list[int]] | None:
        idx = list(self.loader.sampler)
        bs = self.loader.batch_size
        return [idx[i:i + bs] for i in range(0, len(idx), bs)]

    @staticmethod
    def accepts(data: Any) -> bool:
        return isinstance(data, DataLoader) and isinstance(data.sampler, DistributedSampler)


def split_plain_loader(loader: DataLoader, seed: int, role: str) -> DataLoader | None:
    """On several ranks, the same loader over a ``DistributedBatchSampler`` (Lightning does the same).

    A plain ``DataLoader`` (sequential or shuffled, no distributed sampler) would otherwise give every rank
    the whole data: each sample trained once per rank. Loaders with another sampler are kept as they are,
    with a warning (once) that every rank reads all of it.
    """
    split = data_split()  # Note [data group]: the data-parallel group under mp/pp
    if split["num_replicas"] == 1 or not collective.is_initialized():
        return None
    plain = (type(loader.batch_sampler) is BatchSampler and type(loader.sampler) in (SequentialSampler, RandomSampler)
             and not isinstance(loader.dataset, IterableDataset))
    if not plain:
        warn_once(f"unsplit-{role}", f"fleetlite: the {role} DataLoader has a custom sampler and no distributed "
                                     f"one, so each of the {split['num_replicas']} data-parallel ranks reads all "
                                     "of it; "
                                     "give it a fleetlite.io.DistributedBatchSampler (or torch's "
                                     "DistributedSampler) to split it across ranks")
        return None
    sampler = DistributedBatchSampler(loader.dataset, loader.batch_size, shuffle=isinstance(loader.sampler,
                                      RandomSampler), drop_last=loader.drop_last, seed=seed, **split)
    kwargs = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                  timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                  multiprocessing_context=loader.multiprocessing_context)
    if loader.num_workers > 0:
        kwargs.update(prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers)
    return DataLoader(loader.dataset, batch_sampler=sampler, **kwargs)
