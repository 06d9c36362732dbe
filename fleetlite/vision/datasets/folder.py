"""Paddle's ``DatasetFolder`` and ``ImageFolder``: images read from a folder tree (``paddle.vision.datasets``).

``DatasetFolder(root)`` expects one sub-folder per class (``root/cat/1.png``)
and returns ``(sample, class_index)``; ``ImageFolder(root)`` takes every image
under ``root`` and returns ``[sample]`` (a one-element list, as Paddle).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch.utils.data

from ..image import get_image_backend

__all__ = ["DatasetFolder", "ImageFolder", "IMG_EXTENSIONS", "has_valid_extension", "make_dataset", "pil_loader",
           "cv2_loader", "default_loader"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def has_valid_extension(filename: str, extensions: Sequence[str]) -> bool:
    """Whether ``filename`` ends with one of ``extensions`` (case-insensitive)."""
    if not isinstance(extensions, (list, tuple)):
        raise TypeError(f"extensions must be a list or tuple of suffixes such as ('.jpg', '.png'), got "
                        f"{type(extensions).__name__}")
    return filename.lower().endswith(tuple(x.lower() for x in extensions))


def _validator(extensions: Sequence[str] | None, is_valid_file: Callable[[str], bool] | None):
    if extensions is None and is_valid_file is not None:
        return is_valid_file, "is_valid_file"
    extensions = IMG_EXTENSIONS if extensions is None else extensions
    return (lambda path: has_valid_extension(path, extensions)), ",".join(extensions)


def make_dataset(dir: str, class_to_idx: dict[str, int], extensions: Sequence[str] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None) -> list[tuple[str, int]]:
    """``(path, class_index)`` of every valid file under ``dir/<class>/`` (sub-folders included), sorted."""
    valid, _ = _validator(extensions, is_valid_file)
    dir = os.path.expanduser(dir)
    images = []
    for target in sorted(class_to_idx):
        d = os.path.join(dir, target)
        if not os.path.isdir(d):
            continue
        for root, _, fnames in sorted(os.walk(d, followlinks=True)):
            images += [(os.path.join(root, f), class_to_idx[target]) for f in sorted(fnames)
                       if valid(os.path.join(root, f))]
    return images


def pil_loader(path: str) -> Any:
    """The image at ``path`` as an RGB PIL image."""
    from PIL import Image

    with open(path, "rb") as f:
        return Image.open(f).convert("RGB")


def cv2_loader(path: str) -> Any:
    """The image at ``path`` as an RGB uint8 HWC array, read with OpenCV (``pip install opencv-python``)."""
    try:
        import cv2
    except ImportError:
        raise ImportError("the 'cv2' image backend reads files with OpenCV, which is not installed: "
                          "pip install opencv-python-headless, or set_image_backend('pil')") from None
    return cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB)


def default_loader(path: str) -> Any:
    """:func:`cv2_loader` when :func:`fleetlite.vision.get_image_backend` is ``'cv2'``, else :func:`pil_loader`."""
    return cv2_loader(path) if get_image_backend() == "cv2" else pil_loader(path)


class DatasetFolder(torch.utils.data.Dataset):
    """Samples arranged as ``root/<class>/.../<file>``: Paddle's ``paddle.vision.datasets.DatasetFolder``.

    Args:
        root: the root folder; each sub-folder is a class (sorted names give indices 0, 1, ...).
        loader: reads a sample from its path (default :func:`default_loader`: an RGB PIL image).
        extensions: the file suffixes to keep (default :data:`IMG_EXTENSIONS`).
        transform: applied to each sample.
        is_valid_file: decides which files to keep, used when ``extensions`` is not given.

    Items are ``(sample, class_index)`` with an ``int`` index, as Paddle's;
    ``classes``, ``class_to_idx``, ``samples`` and ``targets`` as in Paddle.

    Example::

        ds = DatasetFolder("data/train")           # data/train/cat/1.jpg, data/train/dog/2.png, ...
        image, label = ds[0]                       # RGB PIL image, 0
    """

    def __init__(self, root: str, loader: Callable[[str], Any] | None = None,
                 extensions: Sequence[str] | None = None, transform: Callable | None = None,
                 is_valid_file: Callable[[str], bool] | None = None) -> None:
        self.root = root
        self.transform = transform
        if not os.path.isdir(os.path.expanduser(root)):
            raise RuntimeError(f"DatasetFolder root {root} is not a folder; pass the folder that holds one "
                               "sub-folder per class")
        self.classes = sorted(d.name for d in os.scandir(os.path.expanduser(root)) if d.is_dir())
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = make_dataset(root, self.class_to_idx, extensions, is_valid_file)
        if not self.samples:
            _, accepted = _validator(extensions, is_valid_file)
            raise RuntimeError(f"Found 0 files in subfolders of: {root} (one sub-folder per class expected, "
                               f"holding files that pass {accepted})")
        self.loader = default_loader if loader is None else loader
        self.extensions = IMG_EXTENSIONS if extensions is None and is_valid_file is None else extensions
        self.targets = [s[1] for s in self.samples]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, target = self.samples[index]
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample, target

    def __len__(self) -> int:
        return len(self.samples)


class ImageFolder(torch.utils.data.Dataset):
    """Every image under ``root`` (sub-folders included, no labels): Paddle's ``paddle.vision.datasets.ImageFolder``.

    Same arguments as :class:`DatasetFolder`; items are ``[sample]`` (a
    one-element list, as Paddle returns them); ``samples`` lists the paths.

    Example::

        (image,) = ImageFolder("data/unlabelled")[0]
    """

    def __init__(self, root: str, loader: Callable[[str], Any] | None = None,
                 extensions: Sequence[str] | None = None, transform: Callable | None = None,
                 is_valid_file: Callable[[str], bool] | None = None) -> None:
        self.root = root
        valid, accepted = _validator(extensions, is_valid_file)
        self.samples = [os.path.join(d, f) for d, _, fnames in sorted(os.walk(os.path.expanduser(root),
                                                                                followlinks=True))
                        for f in sorted(fnames) if valid(os.path.join(d, f))]
        if not self.samples:
            raise RuntimeError(f"Found 0 files in subfolders of: {root} (files that pass {accepted} expected)")
        self.loader = default_loader if loader is None else loader
        self.extensions = IMG_EXTENSIONS if extensions is None and is_valid_file is None else extensions
        self.transform = transform

    def __getitem__(self, index: int) -> list[Any]:
        sample = self.loader(self.samples[index])
        if self.transform is not None:
            sample = self.transform(sample)
        return [sample]

    def __len__(self) -> int:
        return len(self.samples)
