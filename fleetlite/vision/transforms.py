"""Batched image transforms on tensors (the fast input path), plus torchvision's per-sample transforms.

The batched ops work on a whole batch ``(B, C, H, W)`` at once, on whatever
device the batch lives on, with per-sample parameters given as tensors
(implemented in :mod:`fleetlite.io.image_ops`, which the generic loader uses;
here with CIFAR-10's statistics as defaults):

* :func:`crop_flip` - per-sample random crop (of a padded image) and
  horizontal flip in one gather, on uint8 or float images;
* :func:`random_crop_flip` - the same with parameters drawn from a generator;
* :func:`normalize` - uint8 to float, ``(x / 255 - mean) / std``, optionally
  channels_last.

Any other name (``ToTensor``, ``Normalize``, ``RandomCrop``, ``Compose``...)
is torchvision's per-sample transform, imported on first use, so Paddle
scripts can keep ``from fleetlite.vision.transforms import ToTensor``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..io import image_ops
from ..io.image_ops import PAD_MODES, crop_flip, crop_flip_params, normalize_params, random_crop_flip

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "PAD_MODES", "crop_flip", "random_crop_flip", "crop_flip_params",
           "normalize", "normalize_params"]

#: Per-channel mean and std of the CIFAR-10 training images (RGB, in [0, 1]).
CIFAR10_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)


def normalize(images: torch.Tensor, mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
              channels_last: bool = False, dtype: torch.dtype = torch.float32,
              params: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """:func:`fleetlite.io.image_ops.normalize` with CIFAR-10's ``mean``/``std`` as defaults.

    ``(images / 255 - mean) / std`` per channel for a uint8 ``(B, C, H, W)``
    batch, as ``dtype`` (torchvision's ``ToTensor()`` + ``Normalize``).
    Example: ``normalize(torch.zeros(1, 3, 2, 2, dtype=torch.uint8)).shape == (1, 3, 2, 2)``.
    """
    return image_ops.normalize(images, mean, std, channels_last=channels_last, dtype=dtype, params=params)


def __getattr__(name: str):
    if name.startswith("_"):
        raise AttributeError(name)
    import torchvision.transforms as tvt  # per-sample transforms: loaded only when asked for

    try:
        return getattr(tvt, name)
    except AttributeError:
        raise AttributeError(f"fleetlite.vision.transforms has no {name!r} (neither the batched ops nor "
                             "torchvision.transforms define it)") from None
