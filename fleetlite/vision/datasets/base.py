"""A map-style image data set over one uint8 ``(N, 3, H, W)`` tensor: the item and tensor interfaces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.utils.data

__all__ = ["ImageArrayDataset", "BACKENDS"]

#: What ``__getitem__`` hands to the transform: a PIL image (torchvision's habit) or an HWC uint8 numpy array.
BACKENDS = ("pil", "numpy")


class ImageArrayDataset(torch.utils.data.Dataset):
    """(image, label) items from a uint8 image tensor and int64 labels, like torchvision's CIFAR10.

    ``__getitem__`` returns ``(transform(image), label)`` with ``image`` a PIL
    image (``backend="pil"``) or an HWC uint8 array (``backend="numpy"``) and
    ``label`` an ``int``; :meth:`as_tensors` returns the whole split for the
    batched pipeline (:class:`fleetlite.io.TensorLoader`).

    Example::

        ds = ImageArrayDataset(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.arange(4), ["a", "b", "c", "d"],
                               backend="numpy")
        image, label = ds[1]     # (32, 32, 3) uint8 array, 1
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes: list[str],
                 transform: Callable | None = None, backend: str = "pil"):
        self.check_item_args(transform, backend)
        self._images = images
        self._labels = labels
        self.classes = list(classes)
        self.transform = transform
        self.backend = backend

    @staticmethod
    def check_item_args(transform: Callable | None, backend: str) -> None:
        """Validate ``transform`` and ``backend`` (subclasses call it before loading anything)."""
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable (e.g. torchvision.transforms.ToTensor()), got "
                            f"{type(transform).__name__}")

    def __len__(self) -> int:
        return int(self._labels.shape[0])

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = np.ascontiguousarray(self._images[index].permute(1, 2, 0).numpy())  # HWC uint8 copy
        if self.backend == "pil":
            from PIL import Image  # torchvision's dependency; loaded only for PIL items

            image = Image.fromarray(image)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self._labels[index])

    def as_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole split: uint8 images ``(N, 3, H, W)`` and int64 labels ``(N,)`` (shared, not copied)."""
        return self._images, self._labels

    @property
    def labels(self) -> list[int]:
        return self._labels.tolist()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={len(self)}, classes={len(self.classes)}, backend={self.backend!r})"
