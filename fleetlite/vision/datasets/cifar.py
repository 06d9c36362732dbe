"""``Cifar10`` and ``Cifar100``: the official python-pickle releases of CIFAR, read without trusting pickle.

CIFAR-10 (``cifar-10-python.tar.gz``, md5 ``c58f30108f718f92721af3b95e74349a``)
holds ``cifar-10-batches-py/`` with ``data_batch_1..5`` (train),
``test_batch`` and ``batches.meta``; CIFAR-100 (``cifar-100-python.tar.gz``,
md5 ``eb9058c3a382ffc7106e4002c42a8d85``) holds ``cifar-100-python/`` with
``train``, ``test`` and ``meta``. Loaded with latin1 encoding a batch is a
dict with str keys: ``data`` an ``N x 3072`` uint8 array in R, G, B planes of
32x32 rows, ``labels`` (CIFAR-100: ``fine_labels``) a list of ints; the meta's
``label_names`` (``fine_label_names``) are the class names. Only numpy's array
reconstruction is allowed while unpickling, so a tampered file cannot run code.
"""

from __future__ import annotations

import codecs
import os
import pickle
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from ._common import DatasetError, default_root, file_lock, paddle_item, resolve_backend
from .base import ImageArrayDataset

__all__ = ["Cifar10", "Cifar100", "DatasetError", "CIFAR10_URL", "CIFAR10_MD5", "CIFAR100_URL", "CIFAR100_MD5",
           "default_root"]

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR100_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"


@dataclass(frozen=True)
class _Release:
    """Where a CIFAR release keeps what, and how its files and errors name things."""

    title: str  # "CIFAR-10"
    cls: str  # the class reading it, for advice in messages
    url: str
    md5: str
    archive: str
    folder: str
    meta: str
    splits: dict[str, list[str]]
    label_key: str
    names_key: str
    num_classes: int
    root_name: str


CIFAR10 = _Release("CIFAR-10", "Cifar10", CIFAR10_URL, CIFAR10_MD5, "cifar-10-python.tar.gz", "cifar-10-batches-py",
                   "batches.meta", {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]},
                   "labels", "label_names", 10, "cifar10")
CIFAR100 = _Release("CIFAR-100", "Cifar100", CIFAR100_URL, CIFAR100_MD5, "cifar-100-python.tar.gz",
                    "cifar-100-python", "meta", {"train": ["train"], "test": ["test"]}, "fine_labels",
                    "fine_label_names", 100, "cifar100")
# CIFAR-10's names, kept for existing callers
ARCHIVE, FOLDER, META, SPLITS = CIFAR10.archive, CIFAR10.folder, CIFAR10.meta, CIFAR10.splits


def _numpy_reconstruct():
    return np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's own unpickling hook, whatever its module is called


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings, numbers and numpy arrays; refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        if name == "_reconstruct" and module in ("numpy.core.multiarray", "numpy._core.multiarray"):
            return _numpy_reconstruct()
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        if (module, name) == ("_codecs", "encode"):  # bytes pickled with protocol 2
            return codecs.encode
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR file")


def _load_pickle(stream: IO[bytes], where: str, rel: _Release) -> dict:
    try:
        obj = _ArrayUnpickler(stream, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            ImportError, MemoryError, OverflowError, zlib.error, tarfile.TarError, OSError) as e:
        raise DatasetError(f"{where} is truncated or corrupted ({type(e).__name__}: {e}); delete it and download "
                           f"again ({rel.cls}(download=True)) or pass a good copy with data_file=") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"{where} is not a {rel.title} python batch (it holds a {type(obj).__name__}, not a "
                           f"dict); point data_file at the python version of the release ({rel.archive})")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _check_batch(batch: dict, where: str, rel: _Release) -> tuple[np.ndarray, np.ndarray]:
    data, labels = batch.get("data"), batch.get(rel.label_key)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DatasetError(f"{where}: 'data' should be an N x 3072 uint8 array, got {got}; the file is not a "
                           f"{rel.title} python batch or is corrupted: download it again")
    labels = np.asarray(labels if labels is not None else [], dtype=np.int64)
    top = rel.num_classes - 1
    if labels.shape != (data.shape[0],) or (labels.size and (labels.min() < 0 or labels.max() > top)):
        raise DatasetError(f"{where}: '{rel.label_key}' should be {data.shape[0]} ints in 0..{top}, got "
                           f"{labels.size} value(s); the file is corrupted: download it again")
    return data, labels


def _where(path: Path, name: str, rel: _Release) -> str:
    return f"{path} (member {rel.folder}/{name})" if path.is_file() else str(path / name)


def _read_all(path: Path, names: list[str], rel: _Release) -> dict[str, dict]:
    """Unpickle ``names`` from the extracted folder ``path`` or, in one pass, from the .tar.gz archive ``path``."""
    if not path.is_file():
        out = {}
        for name in names:
            if not (path / name).is_file():
                raise FileNotFoundError(f"{rel.title} file {path / name} is missing; download the release again "
                                        f"({rel.cls}(download=True)) or pass data_file= with a complete copy")
            with open(path / name, "rb") as f:
                out[name] = _load_pickle(f, _where(path, name, rel), rel)
        return out
    wanted = {f"{rel.folder}/{n}": n for n in names}
    out = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                name = wanted.get(member.name)
                stream = tar.extractfile(member) if name is not None and member.isfile() else None
                if stream is not None:
                    out[name] = _load_pickle(stream, _where(path, name, rel), rel)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise DatasetError(f"{path}: the archive is truncated, corrupted or not a .tar.gz ({type(e).__name__}: {e}); "
                           f"delete it and download {rel.archive} again (md5 {rel.md5})") from None
    missing = [n for n in names if n not in out]
    if missing:
        raise FileNotFoundError(f"the archive {path} has no {', '.join(f'{rel.folder}/{n}' for n in missing)}: it "
                                f"is not the python release of {rel.title} ({rel.archive}) or it is incomplete; "
                                "download it again")
    return out


def _resolve(data_file: str | os.PathLike | None, root: Path, download: bool, needed: list[str],
             rel: _Release) -> Path:
    if data_file is not None:
        path = Path(data_file).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{rel.title} data_file {path} does not exist; pass the path of {rel.archive} "
                                    f"or of its extracted {rel.folder} folder, or leave data_file=None to use root "
                                    f"(download=True fetches it)")
        if path.is_dir() and (path / rel.folder).is_dir():
            path = path / rel.folder
        return path
    folder = root / rel.folder
    missing = [n for n in needed if not (folder / n).is_file()]
    if not missing:
        return folder
    if (root / rel.archive).is_file():  # the archive put in root: read in place
        return root / rel.archive
    if not download:
        raise FileNotFoundError(f"{rel.title} is not in {folder} (missing {', '.join(missing)}); pass "
                                f"download=True, or data_file= pointing at {rel.archive} or its extracted "
                                f"{rel.folder} folder, or put {rel.archive} in {root}")
    _download(root, rel)
    return folder


def _download(root: Path, rel: _Release) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / ".download.lock"):  # several ranks on one machine: one downloads, the others wait
        if all((root / rel.folder / n).is_file() for names in rel.splits.values() for n in names + [rel.meta]):
            return
        from torchvision.datasets.utils import download_and_extract_archive  # torchvision is heavy: on download

        try:
            download_and_extract_archive(rel.url, download_root=str(root), filename=rel.archive, md5=rel.md5)
        except Exception as e:  # noqa: BLE001 - network and integrity failures all get the same advice
            raise RuntimeError(f"could not download {rel.title} from {rel.url} into {root} ({type(e).__name__}: "
                               f"{e}). Without network, fetch {rel.archive} (md5 {rel.md5}) elsewhere and put it "
                               f"(or its extracted {rel.folder} folder) in {root} (recipes: data.root=DIR), or pass "
                               f"{rel.cls}(data_file=PATH); for offline runs use "
                               "fleetlite.vision.datasets.SyntheticCifar10 (recipes: data=synthetic)") from None


class Cifar10(ImageArrayDataset):
    """CIFAR-10 from the official python release: Paddle's ``paddle.vision.datasets.Cifar10``.

    Args:
        data_file: the ``cifar-10-python.tar.gz`` archive (read in place) or
            its extracted ``cifar-10-batches-py`` folder (or a folder holding
            it). ``None``: use ``root``, downloading there when needed.
        mode: ``"train"`` (the ``data_batch_*`` files, 50000 images) or
            ``"test"`` (``test_batch``, 10000).
        transform: applied to each item's image.
        download: fetch the archive (md5-checked, with torchvision) into
            ``root`` when ``data_file`` is None and ``root`` lacks it.
        backend: ``"pil"`` (items are PIL images) or ``"cv2"`` (HWC arrays,
            cast to float32 after the transform, as Paddle does); ``None``:
            :func:`fleetlite.vision.get_image_backend` (``"pil"``).
        root: fleetlite's addition, the folder for ``data_file=None``
            (default ``$FLEETLITE_DATA_HOME/cifar10`` or
            ``~/.cache/fleetlite/datasets/cifar10``); it may hold the
            extracted folder or the archive.

    Items are Paddle's: ``(image, label)`` with ``label`` a 0-d int64 numpy
    array. :meth:`as_tensors` gives the whole split as uint8
    ``(N, 3, 32, 32)`` and int64 ``(N,)`` for :class:`fleetlite.io.TensorLoader`.

    Example::

        from torchvision.transforms import ToTensor
        from fleetlite.vision.datasets import Cifar10
        test = Cifar10(mode="test", transform=ToTensor())
        image, label = test[0]                 # float (3, 32, 32), array(3) ("cat")
        images, labels = test.as_tensors()     # uint8 (10000, 3, 32, 32), int64 (10000,)
    """

    _release = CIFAR10

    def __init__(self, data_file: str | os.PathLike | None = None, mode: str = "train",
                 transform: Callable | None = None, download: bool = True, backend: str | None = None,
                 root: str | os.PathLike | None = None):
        rel = self._release
        mode = mode.lower() if isinstance(mode, str) else mode
        if mode not in rel.splits:
            raise ValueError(f"mode={mode!r} must be 'train' or 'test'")
        backend = resolve_backend(backend)
        self.check_item_args(transform, "pil")
        self.mode = mode
        self.root = Path(root).expanduser() if root is not None else default_root(rel.root_name)
        names = rel.splits[mode]
        path = _resolve(data_file, self.root, download, names + [rel.meta], rel)
        self.data_file = path
        files = _read_all(path, [rel.meta] + names, rel)
        classes = files[rel.meta].get(rel.names_key)
        if not isinstance(classes, list) or len(classes) != rel.num_classes or \
                not all(isinstance(c, str) for c in classes):
            raise DatasetError(f"{_where(path, rel.meta, rel)}: '{rel.names_key}' should be {rel.num_classes} "
                               f"class names, got {classes!r:.100}; the file is corrupted: download it again")
        parts = [_check_batch(files[n], _where(path, n, rel), rel) for n in names]
        data = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        labels = np.concatenate([p[1] for p in parts])
        images = torch.from_numpy(np.ascontiguousarray(data)).view(-1, 3, 32, 32)
        super().__init__(images, torch.from_numpy(labels), classes, transform, "pil")
        self.backend = backend

    def __getitem__(self, index: int) -> tuple[Any, np.ndarray]:
        image = np.ascontiguousarray(self._images[index].permute(1, 2, 0).numpy())  # HWC uint8 copy
        return paddle_item(image, np.array(int(self._labels[index]), dtype=np.int64), self.transform, self.backend)


class Cifar100(Cifar10):
    """CIFAR-100 (fine labels, 100 classes) from the official python release: Paddle's
    ``paddle.vision.datasets.Cifar100``, same arguments and items as :class:`Cifar10`.

    ``data_file`` is ``cifar-100-python.tar.gz`` or its extracted
    ``cifar-100-python`` folder; ``mode="train"`` reads ``train`` (50000
    images), ``"test"`` reads ``test`` (10000); ``root`` defaults to
    ``$FLEETLITE_DATA_HOME/cifar100``.

    Example::

        train = Cifar100(data_file="cifar-100-python.tar.gz", mode="train")
        image, label = train[0]                # PIL image, array(19)
    """

    _release = CIFAR100
