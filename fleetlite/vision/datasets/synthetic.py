"""``SyntheticCifar10``: a deterministic, learnable, CIFAR-10-shaped stand-in, made in seconds without a network.

SYNTHETIC DATA: for offline runs, tests and ``make run``; accuracies on it say
nothing about CIFAR-10.

Each image is one of ten shape/texture classes (stripes in three
orientations, checkerboard, disc, ring, cross, square outline, triangle, two
dots) drawn at a random position, size, rotation and frequency, in random
foreground and background colours (faintly tinted per class), under a random
illumination gradient and pixel noise. The class is in the spatial pattern,
not in the colour statistics, so a small CNN learns it well within a minute
while a linear model on pixels does poorly. The class definitions are fixed;
``seed`` and ``mode`` only choose the draws, so train and test splits (and
any seeds) share one distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from .base import ImageArrayDataset

__all__ = ["SyntheticCifar10", "SYNTHETIC_CLASSES", "make_synthetic_cifar10"]

SYNTHETIC_CLASSES = ["horizontal stripes", "vertical stripes", "diagonal stripes", "checkerboard", "disc", "ring",
                     "cross", "square outline", "triangle", "two dots"]
_DEFAULT_SIZE = {"train": 50000, "test": 10000}
_MODE_ID = {"train": 0, "test": 1}
_CHUNK = 4096
_NOISE = 0.35  # width of the uniform pixel noise, in [0, 1] units
_SIDE = 32
# a faint per-class colour tint (RGB in [0, 1]); spatial pattern carries the class, colour only hints
_PALETTE = torch.tensor([[0.9, 0.2, 0.2], [0.2, 0.8, 0.2], [0.2, 0.3, 0.9], [0.9, 0.8, 0.1], [0.8, 0.2, 0.8],
                         [0.1, 0.8, 0.8], [0.9, 0.5, 0.1], [0.5, 0.5, 0.5], [0.4, 0.9, 0.5], [0.5, 0.3, 0.1]])


def _stripes(a: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(6.0 * torch.sin(math.pi * freq * a))


def _pattern(k: int, u: torch.Tensor, v: torch.Tensor, freq: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
    """Foreground weight in [0, 1] of class ``k`` in the sample's own (shifted, rotated, scaled) coordinates."""
    r = torch.sqrt(u * u + v * v)

    def band(dist: torch.Tensor) -> torch.Tensor:  # soft |dist| < width
        return torch.sigmoid((width - dist.abs()) * 25.0)

    def inside(dist: torch.Tensor) -> torch.Tensor:  # soft dist < 0
        return torch.sigmoid(-dist * 25.0)

    if k == 0:
        return _stripes(v, freq)
    if k == 1:
        return _stripes(u, freq)
    if k == 2:
        return _stripes((u + v) / math.sqrt(2.0), freq)
    if k == 3:
        return torch.sigmoid(6.0 * torch.sin(math.pi * freq * u) * torch.sin(math.pi * freq * v))
    if k == 4:
        return inside(r - 1.0)
    if k == 5:
        return band(r - 1.0)
    if k == 6:
        return torch.maximum(band(u), band(v)) * inside(torch.maximum(u.abs(), v.abs()) - 1.2)
    if k == 7:
        return band(torch.maximum(u.abs(), v.abs()) - 1.0)
    if k == 8:
        return inside(torch.maximum(-v - 0.8, u.abs() * 1.6 - (1.0 - v) * 0.8))
    return torch.maximum(inside(torch.sqrt((u - 0.65) ** 2 + v * v) - 0.45),
                         inside(torch.sqrt((u + 0.65) ** 2 + v * v) - 0.45))


def _chunk(labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    n = labels.shape[0]

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen)

    grid = (torch.arange(_SIDE, dtype=torch.float32) + 0.5) / _SIDE * 2.0 - 1.0  # pixel centres in [-1, 1]
    x, y = grid.view(1, 1, _SIDE), grid.view(1, _SIDE, 1)
    cx, cy = (rand(n, 1, 1) - 0.5) * 0.7, (rand(n, 1, 1) - 0.5) * 0.7
    scale = 0.35 + 0.4 * rand(n, 1, 1)
    theta = (rand(n, 1, 1) - 0.5) * 0.6
    cos, sin = torch.cos(theta), torch.sin(theta)
    u = ((x - cx) * cos + (y - cy) * sin) / scale
    v = (-(x - cx) * sin + (y - cy) * cos) / scale
    freq = (2.0 + 2.0 * rand(n, 1, 1)) * scale  # 2 to 4 stripe periods across the image, whatever the scale
    width = 0.12 + 0.12 * rand(n, 1, 1)
    mask = torch.empty(n, _SIDE, _SIDE)
    for k in range(len(SYNTHETIC_CLASSES)):
        sel = (labels == k).nonzero().view(-1)
        if sel.numel():
            mask[sel] = _pattern(k, u[sel], v[sel], freq[sel], width[sel])
    tint = _PALETTE[labels].view(n, 3, 1, 1)
    fg = 0.7 * rand(n, 3, 1, 1) + 0.3 * tint
    bg = rand(n, 3, 1, 1)
    light = (rand(n, 1, 1, 1) - 0.5) * x.unsqueeze(0) * 0.5 + (rand(n, 1, 1, 1) - 0.5) * y.unsqueeze(0) * 0.5
    # everything in 0..255 units; uniform pixel noise of std ~0.1 (centred by the -0.5 folded into the offset)
    img = torch.addcmul(bg, fg - bg, mask.unsqueeze(1)).add_(light).mul_(255.0)
    img.add_(torch.rand(n, 3, _SIDE, _SIDE, generator=gen), alpha=_NOISE * 255.0)
    img.add_(0.5 - 0.5 * _NOISE * 255.0)  # + 0.5: the uint8 cast below truncates, so this rounds
    return img.clamp_(0, 255).to(torch.uint8)


def make_synthetic_cifar10(n: int, mode: str = "train", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` synthetic images (uint8 ``(n, 3, 32, 32)``) and balanced int64 labels, deterministic by ``seed``."""
    if mode not in _MODE_ID:
        raise ValueError(f"mode={mode!r} must be 'train' or 'test'")
    root = np.random.SeedSequence([int(seed), _MODE_ID[mode]])
    label_gen = torch.Generator().manual_seed(int(root.generate_state(1)[0]))
    labels = torch.randperm(n, generator=label_gen) % len(SYNTHETIC_CLASSES)
    chunks = []
    for i, start in enumerate(range(0, n, _CHUNK)):
        state = np.random.SeedSequence([int(seed), _MODE_ID[mode], i + 1]).generate_state(1)[0]
        chunks.append(_chunk(labels[start:start + _CHUNK], torch.Generator().manual_seed(int(state))))
    return torch.cat(chunks), labels.to(torch.int64)


class SyntheticCifar10(ImageArrayDataset):
    """A synthetic CIFAR-10 stand-in (NOT real data): same shapes, items and tensors as :class:`Cifar10`.

    Ten learnable shape/texture classes (see the module docstring), 32x32 RGB
    uint8, deterministic by ``seed``; the train and test splits are different
    draws of the same distribution. 50000 images take a few seconds.

    Args:
        mode: ``"train"`` (default 50000 images) or ``"test"`` (10000).
        transform: applied to each item's image (a PIL image, or an HWC uint8
            array with ``backend="numpy"``).
        size: number of images (default per mode).
        seed: chooses the draws; class definitions never change.
        backend: ``"pil"`` or ``"numpy"``.

    Example::

        from torchvision.transforms import ToTensor
        from fleetlite.vision.datasets import SyntheticCifar10
        train = SyntheticCifar10(mode="train", transform=ToTensor(), size=2000)
        image, label = train[0]                   # float (3, 32, 32), int
        images, labels = train.as_tensors()       # uint8 (2000, 3, 32, 32), int64 (2000,)
    """

    def __init__(self, mode: str = "train", transform: Callable | None = None, size: int | None = None,
                 seed: int = 0, backend: str = "pil"):
        if mode not in _DEFAULT_SIZE:
            raise ValueError(f"mode={mode!r} must be 'train' or 'test'")
        self.check_item_args(transform, backend)
        if size is None:
            size = _DEFAULT_SIZE[mode]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size={size!r} must be a positive integer (or None for {_DEFAULT_SIZE[mode]})")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be an integer >= 0")
        self.mode, self.seed = mode, seed
        images, labels = make_synthetic_cifar10(size, mode, seed)
        super().__init__(images, labels, SYNTHETIC_CLASSES, transform, backend)
