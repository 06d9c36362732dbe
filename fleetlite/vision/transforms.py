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

Two per-sample transforms follow Paddle (``paddle.vision.transforms``), whose
habits differ from torchvision's: :class:`Normalize` (``mean``, ``std``,
``data_format``, ``to_rgb``; also takes PIL images and HWC arrays, as Paddle's
MNIST programs use it) and :class:`Transpose`. Any other name (``ToTensor``,
``RandomCrop``, ``Compose``...) is torchvision's per-sample transform,
imported on first use, so Paddle scripts can keep
``from fleetlite.vision.transforms import ToTensor``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..io import image_ops
from ..io.image_ops import PAD_MODES, crop_flip, crop_flip_params, normalize_params, random_crop_flip

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "PAD_MODES", "crop_flip", "random_crop_flip", "crop_flip_params",
           "normalize", "normalize_params", "Normalize", "Transpose"]

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


def _is_pil(img: Any) -> bool:
    return type(img).__module__.startswith("PIL.")


class Normalize:
    """Paddle's ``paddle.vision.transforms.Normalize``: ``(img - mean) / std`` per channel, on any image type.

    Args:
        mean, std: one number (used for three channels, as Paddle) or one per channel. Defaults 0.0 and 1.0.
        data_format: ``"CHW"`` (the means broadcast as ``(C, 1, 1)``) or ``"HWC"`` (as ``(1, 1, C)``).
        to_rgb: reverse the channel order (BGR to RGB) of an array first.
        keys: Paddle's multi-input form; only ``None`` is supported.

    A tensor is normalised as torchvision's ``Normalize`` does (for
    ``"CHW"``). A PIL image or a numpy array becomes a float32 array first
    and is normalised by broadcasting, as Paddle does: a 28x28 grayscale image
    with ``mean=[127.5], std=[127.5]`` gives a ``(1, 28, 28)`` array, which is
    how Paddle's MNIST programs get their channel axis.

    Example::

        import numpy as np
        out = Normalize(mean=[127.5], std=[127.5], data_format="CHW")(np.full((28, 28), 255, np.uint8))
        assert out.shape == (1, 28, 28) and out.dtype == np.float32 and float(out.max()) == 1.0
    """

    def __init__(self, mean: float | Sequence[float] = 0.0, std: float | Sequence[float] = 1.0,
                 data_format: str = "CHW", to_rgb: bool = False, keys: Any = None) -> None:
        if data_format not in ("CHW", "HWC"):
            raise ValueError(f"data_format={data_format!r} should be 'CHW' or 'HWC'")
        if keys is not None:
            raise NotImplementedError("Normalize(keys=...): Paddle's multi-input transforms are not supported; "
                                      "apply the transform to each input")
        self.mean = [mean] * 3 if isinstance(mean, numbers.Number) else list(mean)
        self.std = [std] * 3 if isinstance(std, numbers.Number) else list(std)
        self.data_format, self.to_rgb = data_format, to_rgb

    def __call__(self, img: Any) -> Any:
        shape = (-1, 1, 1) if self.data_format == "CHW" else (1, 1, -1)
        if isinstance(img, torch.Tensor):
            mean = torch.as_tensor(self.mean, dtype=img.dtype, device=img.device).view(shape)
            std = torch.as_tensor(self.std, dtype=img.dtype, device=img.device).view(shape)
            return (img - mean) / std
        img = np.asarray(img).astype(np.float32) if _is_pil(img) else np.asarray(img)
        if self.to_rgb:
            img = img[..., ::-1]
        mean = np.float32(np.array(self.mean).reshape(shape))
        std = np.float32(np.array(self.std).reshape(shape))
        return (img - mean) / std

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std}, data_format={self.data_format!r})"


class Transpose:
    """Paddle's ``paddle.vision.transforms.Transpose``: a PIL image or HWC array (a 2-D one gets a channel axis)
    as an array with its axes in ``order`` (default ``(2, 0, 1)``: HWC to CHW); a tensor is permuted.

    Example::

        import numpy as np
        assert Transpose()(np.zeros((28, 28), np.uint8)).shape == (1, 28, 28)
    """

    def __init__(self, order: Sequence[int] = (2, 0, 1), keys: Any = None) -> None:
        if keys is not None:
            raise NotImplementedError("Transpose(keys=...): Paddle's multi-input transforms are not supported")
        self.order = tuple(order)

    def __call__(self, img: Any) -> Any:
        if isinstance(img, torch.Tensor):
            return img.permute(self.order)
        img = np.asarray(img)
        if img.ndim == 2:
            img = img[..., np.newaxis]
        return img.transpose(self.order)


def __getattr__(name: str):
    if name.startswith("_"):
        raise AttributeError(name)
    import torchvision.transforms as tvt  # per-sample transforms: loaded only when asked for

    try:
        return getattr(tvt, name)
    except AttributeError:
        raise AttributeError(f"fleetlite.vision.transforms has no {name!r} (neither the batched ops nor "
                             "torchvision.transforms define it)") from None
