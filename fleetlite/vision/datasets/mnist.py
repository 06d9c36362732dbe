"""``MNIST`` and ``FashionMNIST``: Paddle's readers of the idx-ubyte files (gzip-compressed or not).

An idx file is big-endian: two zero bytes, the element type (``0x08``,
unsigned byte), the number of dimensions, one 4-byte size per dimension, then
the data. Images are ``idx3`` (count, rows, cols), labels ``idx1`` (count).
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

from ._common import DatasetError, default_root, file_lock, paddle_item, resolve_backend

__all__ = ["MNIST", "FashionMNIST", "read_idx"]


def read_idx(path: str | os.PathLike, ndim: int) -> np.ndarray:
    """The uint8 array of an idx-ubyte file with ``ndim`` dimensions (``.gz`` or not); a clear error otherwise."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DatasetError(f"{path} is truncated or corrupted ({type(e).__name__}: {e}); delete it and download it "
                           "again") from None
    header = 4 + 4 * ndim
    if len(raw) < header or raw[:3] != b"\x00\x00\x08" or raw[3] != ndim:
        raise DatasetError(f"{path} is not an idx{ndim}-ubyte file (its magic number is {raw[:4].hex() or 'empty'}, "
                           f"expected 0000080{ndim}); pass the {'image' if ndim == 3 else 'label'} file of the "
                           "release (e.g. train-images-idx3-ubyte.gz / train-labels-idx1-ubyte.gz)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    count = math.prod(dims)
    if len(raw) - header != count:
        raise DatasetError(f"{path}: the header promises {' x '.join(map(str, dims))} = {count} bytes of data but "
                           f"the file holds {len(raw) - header}; it is truncated or corrupted: download it again")
    return np.frombuffer(raw, np.uint8, count, header).reshape(dims).copy()  # writable, as torch wants


class MNIST(torch.utils.data.Dataset):
    """MNIST from its idx-ubyte files: Paddle's ``paddle.vision.datasets.MNIST``.

    Args:
        image_path: the images file (``train-images-idx3-ubyte.gz`` or
            ``t10k-...``, gzip-compressed or not). ``None``: the file of
            ``mode`` in ``root``, downloaded there when missing and ``download``.
        label_path: the labels file (``train-labels-idx1-ubyte.gz`` ...), likewise.
        mode: ``"train"`` or ``"test"``: which files ``None`` paths stand for.
        transform: applied to each item's image.
        download: fetch missing files (md5-checked, with torchvision) from
            Paddle's mirror into ``root``.
        backend: ``"pil"`` (28x28 grayscale PIL images) or ``"cv2"`` (28x28
            arrays, float32 after the transform, as Paddle); ``None``:
            :func:`fleetlite.vision.get_image_backend` (``"pil"``).
        root: fleetlite's addition, the folder for ``None`` paths (default
            ``$FLEETLITE_DATA_HOME/mnist`` or ``~/.cache/fleetlite/datasets/mnist``).

    Items are Paddle's: ``(image, label)`` with ``label`` an int64 numpy array
    of shape ``(1,)``. ``images`` is the uint8 ``(N, 28, 28)`` array,
    ``labels`` the int64 ``(N, 1)`` one; :meth:`as_tensors` gives uint8
    ``(N, 1, 28, 28)`` and int64 ``(N,)`` tensors for :class:`fleetlite.io.TensorLoader`.

    Example::

        from torchvision.transforms import ToTensor
        train = MNIST(mode="train", transform=ToTensor())
        image, label = train[0]                # float (1, 28, 28), array([5])
    """

    NAME = "mnist"
    URL_PREFIX = "https://dataset.bj.bcebos.com/mnist/"
    TEST_IMAGE_URL = URL_PREFIX + "t10k-images-idx3-ubyte.gz"
    TEST_IMAGE_MD5 = "9fb629c4189551a2d022fa330f9573f3"
    TEST_LABEL_URL = URL_PREFIX + "t10k-labels-idx1-ubyte.gz"
    TEST_LABEL_MD5 = "ec29112dd5afa0611ce80d1b7f02629c"
    TRAIN_IMAGE_URL = URL_PREFIX + "train-images-idx3-ubyte.gz"
    TRAIN_IMAGE_MD5 = "f68b3c2dcbeaaa9fbdd348bbdeb94873"
    TRAIN_LABEL_URL = URL_PREFIX + "train-labels-idx1-ubyte.gz"
    TRAIN_LABEL_MD5 = "d53e105ee54ea40749a09fcbcd1e9432"

    def __init__(self, image_path: str | os.PathLike | None = None, label_path: str | os.PathLike | None = None,
                 mode: str = "train", transform: Callable | None = None, download: bool = True,
                 backend: str | None = None, root: str | os.PathLike | None = None) -> None:
        mode = mode.lower() if isinstance(mode, str) else mode
        if mode not in ("train", "test"):
            raise ValueError(f"mode={mode!r} must be 'train' or 'test'")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable (e.g. torchvision.transforms.ToTensor()), got "
                            f"{type(transform).__name__}")
        self.mode, self.transform, self.backend = mode, transform, resolve_backend(backend)
        self.root = Path(root).expanduser() if root is not None else default_root(self.NAME)
        self.image_path = self._locate(image_path, "image", download)
        self.label_path = self._locate(label_path, "label", download)
        images, labels = read_idx(self.image_path, 3), read_idx(self.label_path, 1)
        if images.shape[0] != labels.shape[0]:
            raise DatasetError(f"{self.image_path} holds {images.shape[0]} images but {self.label_path} "
                               f"{labels.shape[0]} labels: the two files are not of the same split")
        if labels.size and labels.max() > 9:
            raise DatasetError(f"{self.label_path}: labels should be in 0..9, found {int(labels.max())}; it is not "
                               f"a {type(self).__name__} label file")
        self.images = images
        self.labels = labels.astype(np.int64).reshape(-1, 1)

    def _locate(self, path: str | os.PathLike | None, kind: str, download: bool) -> Path:
        if path is not None:
            found = Path(path).expanduser()
            if not found.is_file():
                raise FileNotFoundError(f"{type(self).__name__} {kind}_path {found} does not exist; pass the "
                                        f"{kind} file (idx-ubyte, .gz or not), or {kind}_path=None to use {self.root}")
            return found
        url = getattr(self, f"{self.mode.upper()}_{kind.upper()}_URL")
        md5 = getattr(self, f"{self.mode.upper()}_{kind.upper()}_MD5")
        name = url.rsplit("/", 1)[1]
        for candidate in (self.root / name, self.root / name[: -len(".gz")]):
            if candidate.is_file():
                return candidate
        if not download:
            raise FileNotFoundError(f"{type(self).__name__}: {kind}_path is not set and {self.root / name} does not "
                                    f"exist; pass {kind}_path=..., put the file there, or download=True")
        self.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.root / ".download.lock"):  # several ranks on one machine: one downloads
            if not (self.root / name).is_file():
                from torchvision.datasets.utils import download_url  # torchvision is heavy: on download only

                try:
                    download_url(url, str(self.root), filename=name, md5=md5)
                except Exception as e:  # noqa: BLE001 - network and integrity failures get the same advice
                    raise RuntimeError(f"could not download {url} into {self.root} ({type(e).__name__}: {e}). "
                                       f"Without network, fetch it (md5 {md5}) elsewhere and put it at "
                                       f"{self.root / name}, or pass {kind}_path=PATH") from None
        return self.root / name

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, idx: int) -> tuple[Any, np.ndarray]:
        return paddle_item(self.images[idx].copy(), self.labels[idx].copy(), self.transform, self.backend)

    def as_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole split: uint8 images ``(N, 1, 28, 28)`` and int64 labels ``(N,)`` (shared, not copied)."""
        return torch.from_numpy(self.images).unsqueeze(1), torch.from_numpy(self.labels).view(-1)


class FashionMNIST(MNIST):
    """Fashion-MNIST (Zalando's 28x28 clothing images, 10 classes): Paddle's
    ``paddle.vision.datasets.FashionMNIST``; same files, arguments and items as :class:`MNIST`
    (``root`` defaults to ``$FLEETLITE_DATA_HOME/fashion-mnist``).

    Example::

        test = FashionMNIST(mode="test", backend="cv2")
        image, label = test[0]                 # float32 (28, 28), array([9])
    """

    NAME = "fashion-mnist"
    URL_PREFIX = "https://dataset.bj.bcebos.com/fashion_mnist/"
    TEST_IMAGE_URL = URL_PREFIX + "t10k-images-idx3-ubyte.gz"
    TEST_IMAGE_MD5 = "bef4ecab320f06d8554ea6380940ec79"
    TEST_LABEL_URL = URL_PREFIX + "t10k-labels-idx1-ubyte.gz"
    TEST_LABEL_MD5 = "bb300cfdad3c16e7a12a480ee83cd310"
    TRAIN_IMAGE_URL = URL_PREFIX + "train-images-idx3-ubyte.gz"
    TRAIN_IMAGE_MD5 = "8d4fb7e6c68d591d4c3dfef9ec88bf0d"
    TRAIN_LABEL_URL = URL_PREFIX + "train-labels-idx1-ubyte.gz"
    TRAIN_LABEL_MD5 = "25c81989df183df01b3e8a0aad5dffbe"
