"""``Cifar10``: the official python-pickle release of CIFAR-10, read without trusting pickle.

The release (``cifar-10-python.tar.gz``, md5 ``c58f30108f718f92721af3b95e74349a``)
holds ``cifar-10-batches-py/`` with ``data_batch_1..5`` (train),
``test_batch`` and ``batches.meta``. Loaded with latin1 encoding a batch is a
dict with str keys: ``data`` an ``N x 3072`` uint8 array in R, G, B planes of
32x32 rows, ``labels`` a list of ints; the meta's ``label_names`` are the
class names. Only numpy's array reconstruction is allowed while unpickling,
so a tampered file cannot run code.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import pickle
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from .base import ImageArrayDataset

__all__ = ["Cifar10", "DatasetError", "CIFAR10_URL", "CIFAR10_MD5", "default_root"]

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE = "cifar-10-python.tar.gz"
FOLDER = "cifar-10-batches-py"
META = "batches.meta"
SPLITS = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}


class DatasetError(RuntimeError):
    """A data set file exists but cannot be used (truncated, corrupted, not the expected format)."""


def default_root() -> Path:
    """``$FLEETLITE_DATA_HOME/cifar10``, else ``~/.cache/fleetlite/datasets/cifar10``."""
    home = os.environ.get("FLEETLITE_DATA_HOME") or os.path.join("~", ".cache", "fleetlite", "datasets")
    return Path(home).expanduser() / "cifar10"


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
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR-10 file")


def _load_pickle(stream: IO[bytes], where: str) -> dict:
    try:
        obj = _ArrayUnpickler(stream, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            ImportError, MemoryError, OverflowError, zlib.error, tarfile.TarError, OSError) as e:
        raise DatasetError(f"{where} is truncated or corrupted ({type(e).__name__}: {e}); delete it and download "
                           f"again (Cifar10(download=True)) or pass a good copy with data_file=") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"{where} is not a CIFAR-10 python batch (it holds a {type(obj).__name__}, not a dict); "
                           f"point data_file at the python version of the release ({ARCHIVE})")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _check_batch(batch: dict, where: str) -> tuple[np.ndarray, np.ndarray]:
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DatasetError(f"{where}: 'data' should be an N x 3072 uint8 array, got {got}; the file is not a "
                           "CIFAR-10 python batch or is corrupted: download it again")
    labels = np.asarray(labels if labels is not None else [], dtype=np.int64)
    if labels.shape != (data.shape[0],) or (labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise DatasetError(f"{where}: 'labels' should be {data.shape[0]} ints in 0..9, got {labels.size} "
                           f"value(s); the file is corrupted: download it again")
    return data, labels


def _where(path: Path, name: str) -> str:
    return f"{path} (member {FOLDER}/{name})" if path.is_file() else str(path / name)


def _read_all(path: Path, names: list[str]) -> dict[str, dict]:
    """Unpickle ``names`` from the extracted folder ``path`` or, in one pass, from the .tar.gz archive ``path``."""
    if not path.is_file():
        out = {}
        for name in names:
            if not (path / name).is_file():
                raise FileNotFoundError(f"CIFAR-10 file {path / name} is missing; download the release again "
                                        f"(Cifar10(download=True)) or pass data_file= with a complete copy")
            with open(path / name, "rb") as f:
                out[name] = _load_pickle(f, _where(path, name))
        return out
    wanted = {f"{FOLDER}/{n}": n for n in names}
    out = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                name = wanted.get(member.name)
                stream = tar.extractfile(member) if name is not None and member.isfile() else None
                if stream is not None:
                    out[name] = _load_pickle(stream, _where(path, name))
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise DatasetError(f"{path}: the archive is truncated, corrupted or not a .tar.gz ({type(e).__name__}: {e}); "
                           f"delete it and download {ARCHIVE} again (md5 {CIFAR10_MD5})") from None
    missing = [n for n in names if n not in out]
    if missing:
        raise FileNotFoundError(f"the archive {path} has no {', '.join(f'{FOLDER}/{n}' for n in missing)}: it is "
                                f"not the python release of CIFAR-10 ({ARCHIVE}) or it is incomplete; download it "
                                "again")
    return out


def _resolve(data_file: str | os.PathLike | None, root: Path, download: bool, needed: list[str]) -> Path:
    if data_file is not None:
        path = Path(data_file).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"CIFAR-10 data_file {path} does not exist; pass the path of {ARCHIVE} or of "
                                    f"its extracted {FOLDER} folder, or leave data_file=None to use root "
                                    f"(download=True fetches it)")
        if path.is_dir() and (path / FOLDER).is_dir():
            path = path / FOLDER
        return path
    folder = root / FOLDER
    missing = [n for n in needed if not (folder / n).is_file()]
    if not missing:
        return folder
    if not download:
        raise FileNotFoundError(f"CIFAR-10 is not in {folder} (missing {', '.join(missing)}); pass download=True, "
                                f"or data_file= pointing at {ARCHIVE} or its extracted {FOLDER} folder")
    _download(root)
    return folder


def _download(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / ".download.lock"):  # several ranks on one machine: one downloads, the others wait
        if all((root / FOLDER / n).is_file() for names in SPLITS.values() for n in names + [META]):
            return
        from torchvision.datasets.utils import download_and_extract_archive  # torchvision is heavy: on download

        try:
            download_and_extract_archive(CIFAR10_URL, download_root=str(root), filename=ARCHIVE, md5=CIFAR10_MD5)
        except Exception as e:  # noqa: BLE001 - network and integrity failures all get the same advice
            raise RuntimeError(f"could not download CIFAR-10 from {CIFAR10_URL} into {root} ({type(e).__name__}: "
                               f"{e}). Without network, fetch {ARCHIVE} elsewhere and put it (or its extracted "
                               f"{FOLDER} folder) in {root} (recipes: data.root=DIR), or pass "
                               "Cifar10(data_file=PATH); for offline runs use "
                               "fleetlite.vision.datasets.SyntheticCifar10 (recipes: data=synthetic)") from None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl  # POSIX only
    except ImportError:  # not POSIX: no inter-process lock
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Cifar10(ImageArrayDataset):
    """CIFAR-10 from the official python release (Paddle's ``paddle.vision.datasets.Cifar10``).

    Args:
        data_file: the ``cifar-10-python.tar.gz`` archive (read in place) or
            its extracted ``cifar-10-batches-py`` folder (or a folder holding
            it). ``None``: use ``root``, downloading there when needed.
        mode: ``"train"`` (50000 images) or ``"test"`` (10000).
        transform: applied to each item's image: a PIL image (``backend="pil"``,
            torchvision's habit) or an HWC uint8 array (``backend="numpy"``).
        download: fetch the archive (md5-checked, with torchvision) when missing.
        root: download folder (default :func:`default_root`).

    Items are ``(transform(image), label)``; :meth:`as_tensors` gives the
    whole split as uint8 ``(N, 3, 32, 32)`` and int64 ``(N,)`` for
    :class:`fleetlite.io.TensorLoader`.

    Example::

        from torchvision.transforms import ToTensor
        from fleetlite.vision.datasets import Cifar10
        test = Cifar10(mode="test", transform=ToTensor())
        image, label = test[0]                 # float (3, 32, 32), 3 ("cat")
        images, labels = test.as_tensors()     # uint8 (10000, 3, 32, 32), int64 (10000,)
    """

    def __init__(self, data_file: str | os.PathLike | None = None, mode: str = "train",
                 transform: Callable | None = None, download: bool = True, root: str | os.PathLike | None = None,
                 backend: str = "pil"):
        if mode not in SPLITS:
            raise ValueError(f"mode={mode!r} must be 'train' or 'test'")
        self.check_item_args(transform, backend)
        self.mode = mode
        self.root = Path(root).expanduser() if root is not None else default_root()
        names = SPLITS[mode]
        path = _resolve(data_file, self.root, download, names + [META])
        self.data_file = path
        files = _read_all(path, [META] + names)
        classes = files[META].get("label_names")
        if not isinstance(classes, list) or len(classes) != 10 or not all(isinstance(c, str) for c in classes):
            raise DatasetError(f"{_where(path, META)}: 'label_names' should be 10 class names, got "
                               f"{classes!r:.100}; the file is corrupted: download it again")
        parts = [_check_batch(files[n], _where(path, n)) for n in names]
        data = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        labels = np.concatenate([p[1] for p in parts])
        images = torch.from_numpy(np.ascontiguousarray(data)).view(-1, 3, 32, 32)
        super().__init__(images, torch.from_numpy(labels), classes, transform, backend)
