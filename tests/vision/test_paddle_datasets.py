"""Paddle's ``paddle.vision.datasets`` readers on small files in the real formats, written here: MNIST and
Fashion-MNIST idx-ubyte(.gz), CIFAR-10/100 python tar.gz; Paddle's item types and shapes (its test_datasets.py)."""

from __future__ import annotations

import gzip
import inspect
import io
import pickle
import struct
import tarfile

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fleetlite.vision import get_image_backend, set_image_backend
from fleetlite.vision.datasets import MNIST, Cifar10, Cifar100, DatasetError, FashionMNIST


def idx_bytes(array: np.ndarray) -> bytes:
    """An idx-ubyte file as the MNIST release writes it: 0, 0, 0x08, ndim, big-endian sizes, the bytes."""
    return bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_mnist(folder, mode="train", n=7, seed=0, gz=True):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    prefix = "train" if mode == "train" else "t10k"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
        path = folder / f"{prefix}-{kind}-ubyte{'.gz' if gz else ''}"
        path.write_bytes(gzip.compress(idx_bytes(arr)) if gz else idx_bytes(arr))
        paths.append(path)
    return images, labels, paths


@pytest.mark.parametrize("cls", [MNIST, FashionMNIST])
def test_mnist_items_are_paddles(tmp_path, cls):
    images, labels, (img_path, lab_path) = write_mnist(tmp_path, "test")
    ds = cls(image_path=str(img_path), label_path=str(lab_path), mode="test")
    assert len(ds) == 7
    image, label = ds[3]  # 'pil': a 28x28 grayscale PIL image, label int64 of shape (1,)
    assert type(image).__name__ == "Image" and image.mode == "L" and image.size == (28, 28)
    assert np.array_equal(np.asarray(image), images[3])
    assert label.dtype == np.int64 and label.shape == (1,) and label[0] == labels[3]
    image, label = cls(image_path=img_path, label_path=lab_path, backend="cv2")[3]
    assert image.dtype == np.float32 and image.shape == (28, 28) and np.array_equal(image, images[3])
    assert label.shape == (1,) and label.dtype == np.int64


def test_mnist_with_transform_and_loader_gives_paddles_batch_shapes(tmp_path):
    from torchvision.transforms import ToTensor

    images, labels, (img, lab) = write_mnist(tmp_path, "train", n=10)
    ds = MNIST(img, lab, "train", ToTensor())  # Paddle's positional order
    x, y = ds[0]
    assert x.shape == (1, 28, 28) and torch.equal(x, torch.from_numpy(images[0]).float().div(255).unsqueeze(0))
    xb, yb = next(iter(DataLoader(ds, batch_size=4)))
    assert xb.shape == (4, 1, 28, 28) and yb.shape == (4, 1) and yb.dtype == torch.int64  # Paddle's [N, 1] labels
    assert yb.view(-1).tolist() == labels[:4].tolist()
    t_images, t_labels = ds.as_tensors()
    assert t_images.shape == (10, 1, 28, 28) and t_images.dtype == torch.uint8 and t_labels.tolist() == labels.tolist()


def test_mnist_mode_picks_the_files_in_root_gz_or_not(tmp_path, monkeypatch):
    train, _, _ = write_mnist(tmp_path / "mnist", "train", n=5, seed=1)
    test, _, _ = write_mnist(tmp_path / "mnist", "test", n=3, seed=2, gz=False)
    a = MNIST(mode="train", download=False, root=tmp_path / "mnist", backend="cv2")
    b = MNIST(mode="TEST", download=False, root=tmp_path / "mnist", backend="cv2")
    assert len(a) == 5 and len(b) == 3 and np.array_equal(a[4][0], train[4]) and np.array_equal(b[2][0], test[2])
    write_mnist(tmp_path / "home" / "fashion-mnist", "train", n=2)
    monkeypatch.setenv("FLEETLITE_DATA_HOME", str(tmp_path / "home"))
    assert len(FashionMNIST(download=False)) == 2


def test_mnist_missing_and_bad_files_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"image_path is not set and .*train-images-idx3-ubyte.gz does not "
                                                r"exist; pass image_path=\.\.\., put the file there, or download=True"):
        MNIST(download=False, root=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"image_path .*nope.gz does not exist"):
        MNIST(image_path=tmp_path / "nope.gz", label_path=tmp_path / "nope2.gz")
    import torchvision.datasets.utils as tvu

    calls = []

    def offline(url, root, filename=None, md5=None, **kw):
        calls.append((url, filename, md5))
        raise OSError("Network is unreachable")

    monkeypatch.setattr(tvu, "download_url", offline)
    with pytest.raises(RuntimeError, match=r"could not download https://dataset.bj.bcebos.com/mnist/t10k-images-"
                                           r"idx3-ubyte.gz.*Network is unreachable.*md5 9fb629c4189551a2d022fa330f"
                                           r"9573f3.*put it at .*t10k-images-idx3-ubyte.gz, or pass image_path="):
        MNIST(mode="test", root=tmp_path / "r")
    assert calls == [("https://dataset.bj.bcebos.com/mnist/t10k-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                      "9fb629c4189551a2d022fa330f9573f3")]
    images, labels, (img, lab) = write_mnist(tmp_path / "bad", n=4)
    lab.write_bytes(gzip.compress(idx_bytes(np.arange(3, dtype=np.uint8))))
    with pytest.raises(DatasetError, match="holds 4 images but .* 3 labels"):
        MNIST(img, lab)
    with pytest.raises(DatasetError, match=r"is not an idx1-ubyte file \(its magic number is 00000803"):
        MNIST(img, img)
    img.write_bytes(gzip.compress(idx_bytes(images))[:-30])
    with pytest.raises(DatasetError, match="truncated or corrupted"):
        MNIST(img, lab)
    img.write_bytes(idx_bytes(images)[:-5])
    with pytest.raises(DatasetError, match=r"promises 4 x 28 x 28 = 3136 bytes .* holds 3131"):
        MNIST(img, lab)
    with pytest.raises(ValueError, match="backend"):
        MNIST(img, lab, backend=1)  # Paddle's test: ValueError
    with pytest.raises(ValueError, match="mode='valid'"):
        MNIST(mode="valid")


def cifar_tar(path, hundred=False, n_train=(3, 2, 4, 1, 2), n_test=3, seed=0):
    """A CIFAR python release as a .tar.gz of protocol-2 pickles (bytes keys, like the original files)."""
    rng = np.random.default_rng(seed)
    folder = "cifar-100-python" if hundred else "cifar-10-batches-py"
    key, k = (b"fine_labels", 100) if hundred else (b"labels", 10)
    batches = ({"train": sum(n_train)} if hundred else {f"data_batch_{i + 1}": n for i, n in enumerate(n_train)})
    batches["test" if hundred else "test_batch"] = n_test
    out = {}
    with tarfile.open(path, "w:gz") as tar:
        def add(name, obj):
            blob = pickle.dumps(obj, protocol=2)
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(blob)

            tar.addfile(info, io.BytesIO(blob))

        for name, n in batches.items():
            batch = {b"batch_label": name.encode(), key: rng.integers(0, k, n).tolist(),
                     b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                     b"filenames": [f"{i}.png".encode() for i in range(n)]}
            if hundred:
                batch[b"coarse_labels"] = rng.integers(0, 20, n).tolist()
            add(name, batch)
            out[name] = batch
        names = [f"class{i}" for i in range(k)]
        add("meta" if hundred else "batches.meta",
            {b"fine_label_names" if hundred else b"label_names": names, b"num_vis": 3072})
    return out, names


def test_cifar10_tar_modes_and_paddle_items(tmp_path):
    batches, _ = cifar_tar(tmp_path / "cifar-10-python.tar.gz")
    train = Cifar10(str(tmp_path / "cifar-10-python.tar.gz"), "train")  # Paddle's positional order
    assert len(train) == 12
    want = np.concatenate([batches[f"data_batch_{i}"][b"data"] for i in range(1, 6)])
    want_labels = sum((batches[f"data_batch_{i}"][b"labels"] for i in range(1, 6)), [])
    image, label = train[7]
    assert type(image).__name__ == "Image" and image.size == (32, 32)
    assert np.array_equal(np.asarray(image), want[7].reshape(3, 32, 32).transpose(1, 2, 0))
    assert label.dtype == np.int64 and label.shape == () and int(label) == want_labels[7]  # Paddle: np.array(label)
    image, label = Cifar10(tmp_path / "cifar-10-python.tar.gz", "train", backend="cv2")[7]
    assert image.dtype == np.float32 and image.shape == (32, 32, 3)  # Paddle's test: shape (32, 32, 3)
    test = Cifar10(tmp_path / "cifar-10-python.tar.gz", mode="test")
    assert len(test) == 3 and test.as_tensors()[1].tolist() == batches["test_batch"][b"labels"]
    xb, yb = next(iter(DataLoader(Cifar10(tmp_path / "cifar-10-python.tar.gz", transform=np.array), batch_size=5)))
    assert xb.shape == (5, 32, 32, 3) and yb.shape == (5,) and yb.dtype == torch.int64


def test_cifar100_reads_fine_labels_and_the_right_split(tmp_path):
    archive = tmp_path / "cifar-100-python.tar.gz"
    batches, names = cifar_tar(archive, hundred=True, n_train=(6,), n_test=4)
    train = Cifar100(archive, mode="train")
    assert len(train) == 6 and train.classes == names and len(names) == 100
    assert train.as_tensors()[1].tolist() == batches["train"][b"fine_labels"]
    assert np.array_equal(train.as_tensors()[0].numpy().reshape(6, 3072), batches["train"][b"data"])
    test = Cifar100(archive, "test", backend="cv2")
    assert len(test) == 4 and int(test[2][1]) == batches["test"][b"fine_labels"][2] and test[2][1].shape == ()
    # the archive dropped into root is read in place; a CIFAR-10 archive is not a CIFAR-100 one
    assert len(Cifar100(mode="test", download=False, root=tmp_path)) == 4
    cifar_tar(tmp_path / "ten.tar.gz")
    with pytest.raises(FileNotFoundError, match=r"has no cifar-100-python/meta, .*not the python release of "
                                                r"CIFAR-100 \(cifar-100-python.tar.gz\)"):
        Cifar100(tmp_path / "ten.tar.gz")
    with pytest.raises(FileNotFoundError, match=r"CIFAR-100 is not in .*cifar-100-python .*put "
                                                r"cifar-100-python.tar.gz in"):
        Cifar100(root=tmp_path / "empty", download=False)


def test_cifar100_label_range_is_checked(tmp_path):
    cifar_tar(tmp_path / "c.tar.gz", hundred=True)
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(tmp_path / "c.tar.gz") as src, tarfile.open(bad, "w:gz") as dst:
        for m in src:
            blob = src.extractfile(m).read()
            if m.name.endswith("/test"):
                batch = pickle.loads(blob)
                batch[b"fine_labels"][0] = 100
                blob = pickle.dumps(batch, protocol=2)
                m.size = len(blob)

            dst.addfile(m, io.BytesIO(blob))
    with pytest.raises(DatasetError, match=r"'fine_labels' should be 3 ints in 0\.\.99"):
        Cifar100(bad, "test")


def test_cifar100_download_failure_names_the_file(tmp_path, monkeypatch):
    import torchvision.datasets.utils as tvu

    def offline(*a, **kw):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(tvu, "download_and_extract_archive", offline)
    with pytest.raises(RuntimeError, match=r"could not download CIFAR-100 from https://www.cs.toronto.edu/~kriz/"
                                           r"cifar-100-python.tar.gz .*md5 eb9058c3a382ffc7106e4002c42a8d85.*"
                                           r"Cifar100\(data_file=PATH\)"):
        Cifar100(root=tmp_path)


def test_image_backend_default_follows_set_image_backend(tmp_path):
    _, _, (img, lab) = write_mnist(tmp_path)
    assert get_image_backend() == "pil"
    set_image_backend("cv2")
    try:
        assert isinstance(MNIST(img, lab)[0][0], np.ndarray)
    finally:
        set_image_backend("pil")
    with pytest.raises(ValueError, match="one of"):
        set_image_backend("tensor")


@pytest.mark.parametrize("cls, params", [
    (MNIST, ["image_path=None", "label_path=None", "mode='train'", "transform=None", "download=True", "backend=None"]),
    (FashionMNIST, ["image_path=None", "label_path=None", "mode='train'", "transform=None", "download=True",
                    "backend=None"]),
    (Cifar10, ["data_file=None", "mode='train'", "transform=None", "download=True", "backend=None"]),
    (Cifar100, ["data_file=None", "mode='train'", "transform=None", "download=True", "backend=None"]),
])
def test_paddle_signatures_then_fleetlites_root(cls, params):
    got = [f"{p.name}={p.default!r}" for p in inspect.signature(cls).parameters.values()]
    assert got == params + ["root=None"]


def test_paddles_mnist_lenet_program_runs(tmp_path):
    """Paddle's beginner program (MNIST, Normalize(mean=[127.5], std=[127.5], data_format='CHW'), LeNet) with
    fleetlite's names and a plain torch loop: [N, 1, 28, 28] float32 images and [N, 1] int64 labels, and it learns."""
    import torch.nn.functional as F

    from fleetlite.vision.models import LeNet
    from fleetlite.vision.transforms import Normalize

    write_mnist(tmp_path / "mnist", "train", n=64)
    train = MNIST(mode="train", transform=Normalize(mean=[127.5], std=[127.5], data_format="CHW"),
                  root=tmp_path / "mnist", download=False)
    loader = DataLoader(train, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
    x, y = next(iter(loader))
    assert x.shape == (16, 1, 28, 28) and x.dtype == torch.float32 and y.shape == (16, 1) and y.dtype == torch.int64
    torch.manual_seed(0)
    net = LeNet()
    opt = torch.optim.Adam(net.parameters(), 3e-3)
    full_x, full_y = next(iter(DataLoader(train, batch_size=64)))

    def loss_all():
        with torch.no_grad():
            return F.cross_entropy(net(full_x), full_y.squeeze(1)).item()

    before = loss_all()
    for _ in range(20):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(net(x), y.squeeze(1)).backward()
            opt.step()
    assert loss_all() < 0.5 * before
