"""The data adapters: one class per input kind; in-memory tensors are gathered a whole batch at a time and give
exactly the batches, order, padding and positions of the DataLoader path they replace."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from fleetlite.io import DistributedBatchSampler, TensorLoader
from fleetlite.io.evaluation import _torch_sampler_counter
from fleetlite.trainer.data_adapter import (
    DataAdapter,
    LimitedAdapter,
    PipelineAdapter,
    SampledAdapter,
    TensorAdapter,
    TorchDistributedAdapter,
    build_adapter,
)


def _tensors(n: int = 23):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, generator=g), torch.randint(0, 5, (n,), generator=g)


def _dataloader_path(x, y, batch, rank, world, shuffle, drop_last):
    ds = TensorDataset(x, y)
    s = DistributedBatchSampler(ds, batch, num_replicas=world, rank=rank, shuffle=shuffle, drop_last=drop_last)
    return DataLoader(ds, batch_sampler=s), s


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("shuffle, drop_last", [(False, False), (True, False), (True, True)])
def test_tensor_adapter_matches_the_dataloader_path(world, shuffle, drop_last):
    x, y = _tensors()
    for rank in range(world):
        loader, sampler = _dataloader_path(x, y, 4, rank, world, shuffle, drop_last)
        adapter = TensorAdapter((x, y), 4, shuffle=shuffle, drop_last=drop_last)
        adapter.sampler = DistributedBatchSampler(adapter.sampler.dataset, 4, num_replicas=world, rank=rank,
                                                  shuffle=shuffle, drop_last=drop_last)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            adapter.set_epoch(epoch)
            assert adapter.length() == len(loader)
            got = list(adapter)
            want = list(loader)
            assert len(got) == len(want)
            for i, (a, b) in enumerate(zip(got, want)):
                assert type(a) is type(b) is list
                assert all(torch.equal(u, v) and u.dtype == v.dtype and u.is_contiguous() for u, v in zip(a, b))
                assert adapter.num_valid(i) == sampler.num_valid(i)


def test_tensor_adapter_positions_resume_like_the_sampler():
    x, y = _tensors(40)
    a = TensorAdapter((x, y), 4, shuffle=True)
    a.set_epoch(1)
    it = iter(a)
    first = [next(it) for _ in range(3)]
    state = a.position(3)
    rest = list(it)
    b = TensorAdapter((x, y), 4, shuffle=True)
    b.load_position(state)
    b.set_epoch(1)
    resumed = list(b)
    assert len(first) + len(resumed) == 10 and a.resumable
    assert all(torch.equal(u, v) for r, s in zip(rest, resumed) for u, v in zip(r, s))


def test_factory_picks_one_adapter_per_kind():
    x, y = _tensors(12)
    ds = TensorDataset(x, y)

    class Custom(TensorDataset):  # its own __getitem__: per-sample path
        def __getitem__(self, i):
            return self.tensors[0][i] * 2, self.tensors[1][i]

    assert type(build_adapter((x, y), 4)) is TensorAdapter
    assert type(build_adapter(ds, 4)) is TensorAdapter
    assert type(build_adapter(Custom(x, y), 4)) is SampledAdapter
    s = DistributedBatchSampler(ds, 4, num_replicas=1, rank=0)
    assert type(build_adapter(DataLoader(ds, batch_sampler=s), 4)) is SampledAdapter
    torch_loader = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, num_replicas=1, rank=0))
    assert type(build_adapter(torch_loader, 4)) is TorchDistributedAdapter
    assert type(build_adapter(DataLoader(ds, batch_size=4), 4)) is DataAdapter
    assert type(build_adapter((b for b in [(x, y)]), 4)) is DataAdapter  # an iterable without len()
    pipeline = TensorLoader(torch.zeros(8, 3, 4, 4, dtype=torch.uint8), torch.zeros(8, dtype=torch.int64), 4,
                            num_replicas=1, rank=0, augment=False)
    assert type(build_adapter(pipeline, 4)) is PipelineAdapter
    limited = LimitedAdapter.wrap(build_adapter(ds, 4), 2)
    assert build_adapter(limited) is limited and len(list(limited)) == 2 and limited.length() == 2
    with pytest.raises(ValueError, match="batch_size=0 must be a positive integer"):
        build_adapter((x, y), 0)


def test_torch_sampler_padding_is_shared_with_drop_padding():
    ds = TensorDataset(torch.arange(10))
    real = []
    for rank in range(3):
        loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, num_replicas=3, rank=rank,
                                                                         shuffle=False))
        adapter = TorchDistributedAdapter(loader)
        count = _torch_sampler_counter(loader)
        real.append([adapter.num_valid(i) for i in range(len(loader))])
        assert real[-1] == [count(i) for i in range(len(loader))]
    # torch deals positions 0..11 round-robin; positions 10 and 11 pad (ranks 1 and 2)
    assert real == [[2, 2], [2, 1], [2, 1]]
