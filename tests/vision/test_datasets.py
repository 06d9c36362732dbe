"""Cifar10 reader on small files in the real format (folder, archive, download) and its errors."""

import os
import pickle
import tarfile

import numpy as np
import pytest
import torch

from fleetlite.vision.datasets import Cifar10, DatasetError
from fleetlite.vision.datasets.cifar import CIFAR10_MD5, FOLDER

NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_release(root, per_batch=4, n_test=3, seed=0):
    """The python release's layout and pickles (protocol 2, like the original), with tiny batches."""
    rng = np.random.default_rng(seed)
    folder = root / FOLDER
    folder.mkdir(parents=True)
    batches = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        batch = {"batch_label": f"{name} of 6", "labels": rng.integers(0, 10, n).tolist(),
                 "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 "filenames": [f"img_{i}.png" for i in range(n)]}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
        batches[name] = batch
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": NAMES, "num_cases_per_batch": per_batch, "num_vis": 3072}, f, protocol=2)
    return batches


def test_reads_the_release_folder(tmp_path):
    batches = write_release(tmp_path)
    train = Cifar10(data_file=tmp_path / FOLDER, mode="train", backend="numpy")
    images, labels = train.as_tensors()
    assert images.shape == (20, 3, 32, 32) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    data = np.concatenate([batches[f"data_batch_{i}"]["data"] for i in range(1, 6)])
    want_labels = sum((batches[f"data_batch_{i}"]["labels"] for i in range(1, 6)), [])
    assert np.array_equal(images.numpy(), data.reshape(20, 3, 32, 32)) and labels.tolist() == want_labels
    image, label = train[5]  # HWC uint8, the R, G, B planes of row 5
    assert image.shape == (32, 32, 3) and label == want_labels[5]
    assert np.array_equal(image[..., 1], data[5, 1024:2048].reshape(32, 32))
    assert train.classes == NAMES and len(train) == 20
    test = Cifar10(root=tmp_path, mode="test", download=False)
    assert len(test) == 3 and test.as_tensors()[1].tolist() == batches["test_batch"]["labels"]


def test_pil_items_with_a_transform_like_torchvision(tmp_path):
    from torchvision.transforms import ToTensor

    write_release(tmp_path)
    ds = Cifar10(data_file=tmp_path, mode="test", transform=ToTensor())
    image, label = ds[2]
    # Paddle's item: the label is a 0-d int64 numpy array (was a python int before Cifar10 followed Paddle)
    assert torch.equal(image, ds.as_tensors()[0][2].float() / 255)
    assert isinstance(label, np.ndarray) and label.dtype == np.int64 and label.shape == () and int(label) == label
    raw, _ = Cifar10(data_file=tmp_path, mode="test")[2]
    assert type(raw).__name__ == "Image" and raw.size == (32, 32)


def test_reads_the_archive_in_place(tmp_path):
    write_release(tmp_path)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / FOLDER, arcname=FOLDER)
    a = Cifar10(data_file=archive, mode="train").as_tensors()
    b = Cifar10(data_file=tmp_path / FOLDER, mode="train").as_tensors()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_download_uses_torchvision_with_the_md5(tmp_path, monkeypatch):
    import torchvision.datasets.utils as tvu

    calls = []

    def fake_download(url, download_root, filename=None, md5=None, **kw):
        calls.append((url, filename, md5))
        write_release(tmp_path / "elsewhere")
        os.replace(tmp_path / "elsewhere" / FOLDER, os.path.join(download_root, FOLDER))

    monkeypatch.setattr(tvu, "download_and_extract_archive", fake_download)
    ds = Cifar10(root=tmp_path / "root", mode="train", download=True)
    assert len(ds) == 20 and calls == [("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                                        "cifar-10-python.tar.gz", CIFAR10_MD5)]
    Cifar10(root=tmp_path / "root", mode="test", download=True)
    assert len(calls) == 1  # present now: no second download

    def offline(*a, **kw):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(tvu, "download_and_extract_archive", offline)
    with pytest.raises(RuntimeError, match="could not download CIFAR-10.*Network is unreachable.*data_file="):
        Cifar10(root=tmp_path / "empty", download=True)


def test_missing_files_say_what_and_how(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"not in .*cifar-10-batches-py.*download=True"):
        Cifar10(root=tmp_path, download=False)
    with pytest.raises(FileNotFoundError, match=r"data_file .*nope.tar.gz does not exist"):
        Cifar10(data_file=tmp_path / "nope.tar.gz")
    write_release(tmp_path)
    os.remove(tmp_path / FOLDER / "data_batch_3")
    with pytest.raises(FileNotFoundError, match=r"data_batch_3 is missing.*download"):
        Cifar10(data_file=tmp_path / FOLDER)
    with pytest.raises(FileNotFoundError, match="missing data_batch_3"):
        Cifar10(root=tmp_path, download=False)


def assert_clean(excinfo):
    """No pickle traceback behind the error."""
    assert excinfo.value.__cause__ is None and excinfo.value.__suppress_context__


def test_truncated_and_corrupted_files_name_the_file(tmp_path):
    write_release(tmp_path)
    path = tmp_path / FOLDER / "data_batch_2"
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DatasetError, match=r"data_batch_2 is truncated or corrupted.*download") as e:
        Cifar10(data_file=tmp_path)
    assert_clean(e)
    path.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(DatasetError, match="data_batch_2 is truncated or corrupted"):
        Cifar10(data_file=tmp_path)
    path.write_bytes(pickle.dumps({"data": np.zeros((2, 10), np.uint8), "labels": [0, 1]}, protocol=2))
    with pytest.raises(DatasetError, match=r"data_batch_2: 'data' should be an N x 3072 uint8 array"):
        Cifar10(data_file=tmp_path)
    path.write_bytes(pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 12]}, protocol=2))
    with pytest.raises(DatasetError, match="'labels' should be 2 ints in 0..9"):
        Cifar10(data_file=tmp_path)


def test_truncated_archive(tmp_path):
    write_release(tmp_path)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / FOLDER, arcname=FOLDER)
    blob = archive.read_bytes()
    archive.write_bytes(blob[: len(blob) * 2 // 3])
    with pytest.raises(DatasetError, match=r"cifar-10-python.tar.gz.*(truncated|corrupted).*download") as e:
        Cifar10(data_file=archive)
    assert_clean(e)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_tampered_pickle_cannot_run_code(tmp_path):
    write_release(tmp_path)
    (tmp_path / FOLDER / "batches.meta").write_bytes(pickle.dumps({"label_names": _Exploit()}, protocol=2))
    with pytest.raises(DatasetError, match="not allowed"):
        Cifar10(data_file=tmp_path, mode="test")


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode='valid'"):
        Cifar10(mode="valid")
    with pytest.raises(ValueError, match="backend"):
        Cifar10(data_file=".", backend="tensor")  # "cv2" is Paddle's float-array backend now
