"""Exact distributed evaluation: 1001 samples, batch 64, world sizes 1, 2, 3 equal single process."""

import math

import pytest
import torch
import torch.distributed as tdist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from fleetlite.io import DistributedBatchSampler, TensorLoader, drop_padding, global_sum, trim_batch
from fleetlite.testing import run_ranks
from fleetlite.vision.transforms import CIFAR10_MEAN, CIFAR10_STD, normalize

N, BATCH = 1001, 64


def _data():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (N, 3, 4, 4), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (N,), generator=g)
    weight = torch.randn(10, 48, generator=g, dtype=torch.float64)
    return images, labels, weight


def _metrics(logits, labels):
    loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
    return int((logits.argmax(1) == labels).sum()), len(labels), loss


def reference():
    """Single process, no loader: the whole set at once."""
    images, labels, weight = _data()
    return _metrics(normalize(images).flatten(1).double() @ weight.T, labels)


def _loaders(rank, world):
    images, labels, _ = _data()
    ds = TensorDataset(normalize(images).flatten(1), labels)  # the same float32 inputs as the TensorLoader's
    shuffled = DistributedBatchSampler(ds, BATCH, world, rank, shuffle=True, seed=3)
    shuffled.set_epoch(2)
    loaders = {
        "tensor_loader": TensorLoader(images, labels, BATCH, shuffle=False, augment=False, num_replicas=world,
                                      rank=rank, mean=CIFAR10_MEAN, std=CIFAR10_STD),
        "dataloader_shuffled": DataLoader(ds, batch_sampler=shuffled),
    }
    if world > 1:
        sampler = DistributedSampler(ds, world, rank, shuffle=True, seed=1)
        loaders["torch_distributed_sampler"] = DataLoader(ds, batch_size=BATCH, sampler=sampler)
    return loaders


def evaluate(rank, world):
    """Per loader kind: (correct, count, loss sum, naive count) summed over the ranks."""
    _, _, weight = _data()
    out = {}
    for name, loader in _loaders(rank, world).items():
        correct = count = 0
        loss = 0.0
        for xb, yb in drop_padding(loader):
            c, n, l = _metrics(xb.flatten(1).double() @ weight.T, yb)
            correct, count, loss = correct + c, count + n, loss + l
        naive = sum(len(yb) for _, yb in loader)
        out[name] = global_sum(correct, count, loss, naive)
    return out


def _check(results, world):
    want = reference()
    for rank_out in results:
        for name, (correct, count, loss, naive) in rank_out.items():
            assert (correct, count) == want[:2], (world, name)
            assert loss == pytest.approx(want[2], rel=1e-12, abs=0), (world, name)
            if world > 1:
                assert naive == 1002, "without dropping the padding the repeats would be counted twice"


def test_world_size_1_equals_single_process(clean_dist_env):
    out = evaluate(0, 1)
    _check([out], 1)
    assert set(out) == {"tensor_loader", "dataloader_shuffled"}


def _ids_on_ranks(rank, world):
    ds = TensorDataset(torch.arange(N))
    sampler = DistributedBatchSampler(ds, BATCH, shuffle=True, seed=5)  # world and rank from the process group
    ids = [int(i) for (b,) in drop_padding(DataLoader(ds, batch_sampler=sampler)) for i in b]
    gathered = [None] * world
    tdist.all_gather_object(gathered, ids)
    return sorted(sum(gathered, [])), len(sampler)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3])
def test_distributed_evaluation_equals_single_process(world):
    results = run_ranks(_multi, world_size=world, timeout=150)
    _check([r[0] for r in results], world)
    for ids, n_batches in (r[1] for r in results):
        assert ids == list(range(N))  # every sample exactly once
        assert n_batches == math.ceil(math.ceil(N / world) / BATCH)
    assert all(r[2] == ([[world, sum(range(world))], [2 * world, 0]], "torch.int64") for r in results)


def _multi(rank, world):
    confusion, = global_sum(torch.tensor([[1, rank], [2, 0]]))  # tensors keep shape and integer dtype
    return evaluate(rank, world), _ids_on_ranks(rank, world), (confusion.tolist(), str(confusion.dtype))


def test_trim_batch_nested():
    batch = {"x": torch.arange(6).view(3, 2), "meta": (["a", "b", "c"], torch.tensor(1.0)), "y": [torch.ones(3)]}
    out = trim_batch(batch, 2)
    assert out["x"].tolist() == [[0, 1], [2, 3]] and out["meta"][0] == ["a", "b"]
    assert out["meta"][1].item() == 1.0 and out["y"][0].shape == (2,)


def test_drop_padding_refuses_what_cannot_be_exact(clean_dist_env):
    ds = TensorDataset(torch.arange(10))
    with pytest.raises(ValueError, match="drop_last=True"):
        next(drop_padding(DataLoader(ds, batch_sampler=DistributedBatchSampler(ds, 4, 2, 0, drop_last=True))))
    with pytest.raises(ValueError, match="drop_last=True"):
        next(drop_padding(DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, 2, 0, drop_last=True))))
    plain = DataLoader(ds, batch_size=4)  # one process, no sampler: nothing to drop
    assert [b[0].tolist() for b in drop_padding(plain)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
