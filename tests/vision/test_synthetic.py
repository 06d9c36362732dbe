"""SyntheticCifar10: CIFAR-10 shaped, deterministic by seed, learnable by a small CNN but not by colour alone."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fleetlite.vision.datasets import SyntheticCifar10
from fleetlite.vision.transforms import normalize


def test_shapes_interfaces_and_balance():
    ds = SyntheticCifar10(mode="test", backend="numpy")
    images, labels = ds.as_tensors()
    assert len(ds) == 10000 and images.shape == (10000, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64 and torch.bincount(labels).tolist() == [1000] * 10
    assert len(ds.classes) == 10
    image, label = ds[3]
    assert image.shape == (32, 32, 3) and label == int(labels[3])
    assert 40 < images.float().mean() < 215 and images.float().std() > 30  # uses the range, not flat


def test_deterministic_by_seed_and_mode():
    a = SyntheticCifar10(size=300, seed=1).as_tensors()
    b = SyntheticCifar10(size=300, seed=1).as_tensors()
    c = SyntheticCifar10(size=300, seed=2).as_tensors()
    t = SyntheticCifar10(mode="test", size=300, seed=1).as_tensors()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[0], t[0])


def test_transform_gets_a_pil_image_by_default():
    from torchvision.transforms import ToTensor

    ds = SyntheticCifar10(size=5, transform=ToTensor())
    x, y = ds[0]
    assert torch.equal(x, ds.as_tensors()[0][0].float() / 255) and isinstance(y, int)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # small ops: a second thread only fights the other processes on the machine
    yield
    torch.set_num_threads(before)


def test_learnable_by_a_small_cnn_but_not_by_colour(one_thread):
    torch.manual_seed(0)
    x_train, y_train = SyntheticCifar10("train", size=3000).as_tensors()
    x_test, y_test = SyntheticCifar10("test", size=500).as_tensors()
    x_train, x_test = normalize(x_train), normalize(x_test)
    # the mean colour of an image says little about its class
    mean_colour = torch.stack([x_train.mean((2, 3))[y_train == k].mean(0) for k in range(10)])
    by_colour = torch.cdist(x_test.mean((2, 3)), mean_colour).argmin(1)
    assert (by_colour == y_test).float().mean() < 0.3
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(),
                          nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        b = torch.randint(0, 3000, (64,), generator=g)
        loss = F.cross_entropy(model(x_train[b]), y_train[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    assert accuracy > 0.35, f"a small CNN should learn the classes quickly (chance is 0.1), got {accuracy:.2f}"


def test_bad_arguments():
    with pytest.raises(ValueError, match="size=0"):
        SyntheticCifar10(size=0)
    with pytest.raises(ValueError, match="mode='val'"):
        SyntheticCifar10(mode="val")
    with pytest.raises(ValueError, match="seed=-1"):
        SyntheticCifar10(size=3, seed=-1)
