"""``build_adapter``: picks the :class:`~.base.DataAdapter` for the kind of data ``fit``/``evaluate``/``predict``
were given (see :mod:`fleetlite.trainer.data_adapter` for the kinds)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ...io.evaluation import find_batch_sampler
from .base import DataAdapter, check_data_split
from .loaders import TorchDistributedAdapter, split_plain_loader
from .sampled import PipelineAdapter, SampledAdapter, dataset_adapter, is_tensor_pipeline
from .tensors import TensorAdapter

__all__ = ["build_adapter"]


def build_adapter(data: Any, batch_size: int = 32, *, shuffle: bool = False, drop_last: bool = False,
                  num_workers: int = 0, seed: int = 0, pin_memory: bool = False, role: str = "train") -> DataAdapter:
    """The adapter for ``data`` (an adapter is returned as it is).

    Example::

        adapter = build_adapter((x, y), batch_size=64, shuffle=True)      # a TensorAdapter
        adapter = build_adapter(dataset, batch_size=64, num_workers=2)     # a DataLoader over a sampler
    """
    if data is None:
        raise ValueError(f"no {role} data given")
    if isinstance(data, DataAdapter):
        return data
    if isinstance(data, (tuple, list)) and data and all(isinstance(t, torch.Tensor) for t in data):
        lengths = {int(t.shape[0]) for t in data}
        if len(lengths) != 1:
            raise ValueError(f"{role} data given as tensors must share their first dimension, got "
                             f"{[tuple(t.shape) for t in data]}")
        return TensorAdapter(data, batch_size, shuffle, drop_last, seed, pin_memory)
    if is_tensor_pipeline(data):
        s = data.batch_sampler
        if hasattr(s, "nranks"):  # Note [data group]
            check_data_split(s.nranks, s.local_rank, f"the {role} TensorLoader's sampler")
        return PipelineAdapter(data)
    if isinstance(data, DataLoader):
        bs = find_batch_sampler(data)
        if bs is not None:
            check_data_split(bs.nranks, bs.local_rank, f"the {role} DataLoader's DistributedBatchSampler")
            return SampledAdapter(data, bs)
        if TorchDistributedAdapter.accepts(data):
            check_data_split(data.sampler.num_replicas, data.sampler.rank, f"the {role} DataLoader's "
                             "DistributedSampler")
            return TorchDistributedAdapter(data)
        split = split_plain_loader(data, seed, role)
        return DataAdapter(data) if split is None else SampledAdapter(split, split.batch_sampler)
    if isinstance(data, Dataset) or (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        if isinstance(data, IterableDataset):
            raise TypeError("an IterableDataset cannot be split into per-rank batches by the Trainer; pass a "
                            "DataLoader over it instead (each rank must then yield its own share)")
        if TensorAdapter.accepts(data):
            return TensorAdapter(data.tensors, batch_size, shuffle, drop_last, seed, pin_memory)
        return dataset_adapter(data, batch_size, shuffle, drop_last, num_workers, seed, pin_memory)
    if hasattr(data, "__iter__"):
        return DataAdapter(data)
    raise TypeError(f"cannot use {type(data).__name__} as {role} data: pass a Dataset, a DataLoader, a "
                    "fleetlite.io.TensorLoader or a tuple of tensors")
