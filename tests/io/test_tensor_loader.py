"""TensorLoader: shapes, exact values without augmentation, per-sample crop/flip, determinism, resume."""

import pytest
import torch

from fleetlite.io import TensorLoader, drop_padding
from fleetlite.vision.transforms import CIFAR10_MEAN, CIFAR10_STD, crop_flip, normalize

N = 150
CIFAR = dict(mean=CIFAR10_MEAN, std=CIFAR10_STD)  # the stats vision.transforms.normalize defaults to


def data(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8), torch.arange(n)


def batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))


def test_shapes_dtypes_and_exact_values_without_augmentation():
    x, y = data()
    loader = TensorLoader(x, y, batch_size=64, shuffle=True, augment=False, num_replicas=1, rank=0, **CIFAR)
    assert len(loader) == 3
    out = batches(loader)
    assert [len(b[1]) for b in out] == [64, 64, 22]
    for images, labels in out:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32) and labels.dtype == torch.int64
        assert torch.equal(images, normalize(x[labels]))  # labels are the sample indices here
    assert sorted(torch.cat([b[1] for b in out]).tolist()) == list(range(N))


def find_params(src, out):
    """The (dy, dx, flip) that turn uint8 image ``src`` into normalised ``out`` (None if no crop/flip does)."""
    for flip in (False, True):
        for dy in range(9):
            for dx in range(9):
                cand = crop_flip(src[None], torch.tensor([dy]), torch.tensor([dx]), torch.tensor([flip]))
                if torch.equal(normalize(cand)[0], out):
                    return dy, dx, flip
    return None


def test_crops_and_flips_are_per_sample_and_real_crops():
    x, y = data()
    loader = TensorLoader(x, y, batch_size=64, num_replicas=1, rank=0, seed=5, **CIFAR)
    images, labels = next(iter(loader))
    params = [find_params(x[int(i)], img) for img, i in zip(images[:40], labels[:40])]
    assert all(p is not None for p in params), "every output must be a crop (+flip) of its own source image"
    assert len(set(params)) > 20
    flips = sum(p[2] for p in params)
    assert 5 <= flips <= 35


def test_deterministic_by_seed_and_epoch():
    x, y = data()
    kw = dict(batch_size=32, num_replicas=1, rank=0)
    a, b = TensorLoader(x, y, seed=3, **kw), TensorLoader(x, y, seed=3, **kw)
    first = batches(a)
    assert same(first, batches(b))
    assert not same(first, batches(TensorLoader(x, y, seed=4, **kw)))
    second = batches(a)  # the epoch advanced by itself: new order and new crops
    assert a.epoch == 2 and not same(first, second)
    c = TensorLoader(x, y, seed=3, **kw)
    c.set_epoch(1)
    assert same(batches(c), second)


def by_sample(out):
    return {int(i): img for images, labels in out for img, i in zip(images, labels)}


def test_augmentation_does_not_depend_on_the_world_size():
    x, y = data()
    single = by_sample(batches(TensorLoader(x, y, batch_size=16, num_replicas=1, rank=0, seed=9)))
    for r in range(3):
        part = by_sample(batches(TensorLoader(x, y, batch_size=16, num_replicas=3, rank=r, seed=9)))
        assert all(torch.equal(img, single[i]) for i, img in part.items())


def test_state_round_trip_mid_epoch():
    x, y = data()
    kw = dict(batch_size=20, num_replicas=2, rank=1, seed=1)
    ref = TensorLoader(x, y, **kw)
    ref.set_epoch(4)
    want = batches(ref)
    run = TensorLoader(x, y, **kw)
    run.set_epoch(4)
    it = iter(run)
    got = [next(it) for _ in range(2)]
    state = run.state_dict()
    resumed = TensorLoader(x, y, **kw)
    resumed.load_state_dict(state)
    resumed.set_epoch(4)
    got += batches(resumed)
    assert same(got, want)


def test_padding_is_marked_for_exact_evaluation():
    x, y = data(n=101)
    seen = []
    for r in range(3):
        loader = TensorLoader(x, y, batch_size=16, shuffle=False, augment=False, num_replicas=3, rank=r)
        assert len(loader) == 3
        seen += [int(i) for _, labels in drop_padding(loader) for i in labels]
        assert loader.num_valid(2) == [2, 2, 1][r]  # 101 = 2 full chunks of 48 + 5 real + 1 padding sample
    assert sorted(seen) == list(range(101))


def test_channels_last_and_reflect():
    x, y = data(n=10)
    loader = TensorLoader(x, y, batch_size=10, num_replicas=1, rank=0, channels_last=True, pad_mode="reflect")
    images, _ = next(iter(loader))
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_clear_errors():
    x, y = data(n=10)
    with pytest.raises(TypeError, match="uint8"):
        TensorLoader(x.float(), y, batch_size=4, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="10 images but 9 labels"):
        TensorLoader(x, y[:9], batch_size=4, num_replicas=1, rank=0)
    with pytest.raises(TypeError, match="int64"):
        TensorLoader(x, y.int(), batch_size=4, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="pad_mode"):
        TensorLoader(x, y, batch_size=4, num_replicas=1, rank=0, pad_mode="wrap")


def test_normalisation_constants_are_made_once_per_device_not_per_batch(monkeypatch):
    import fleetlite.io.loader as loader_mod
    from fleetlite.vision.transforms import normalize

    x = torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8)
    y = torch.zeros(40, dtype=torch.int64)
    made = []
    real = loader_mod.normalize_params
    monkeypatch.setattr(loader_mod, "normalize_params", lambda *a, **k: made.append(a) or real(*a, **k))
    loader = TensorLoader(x, y, batch_size=8, shuffle=False, augment=False, num_replicas=1, rank=0, **CIFAR)
    batches = [b for _ in range(2) for b, _ in loader]
    assert len(batches) == 10 and len(made) == 1  # once for (cpu, float32), not twice per batch
    assert torch.allclose(batches[0], normalize(x[:8]))  # the same numbers as the uncached path


def test_default_normalisation_is_neutral_scaling_to_unit_range():
    """io knows no data set: without mean/std the pixels are only scaled to [0, 1] (torchvision's ToTensor)."""
    x, y = data(8)
    images, _ = next(iter(TensorLoader(x, y, batch_size=8, shuffle=False, augment=False, num_replicas=1, rank=0)))
    assert torch.allclose(images, x.float() / 255)
