"""Paddle's SqueezeNet (``paddle.vision.models.SqueezeNet``), written here with Paddle's layer names.

torchvision's SqueezeNet has the same layer sizes (and parameter counts) but
max-pools with ``ceil_mode=True`` where Paddle floors, and Paddle uses
``downscale_in_infer`` dropout; so it is its own module. Needs torch only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._pretrained import refuse_pretrained
from .alexnet import DownscaleInInferDropout

__all__ = ["SqueezeNet", "squeezenet1_0", "squeezenet1_1"]

_FIRES = [(16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192), (64, 256), (64, 256)]  # squeeze, expand
_POOL_AFTER = {"1.0": (3, 7), "1.1": (2, 4)}  # max-pool after these fire modules (1-based)


class _FireConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel_size: int, padding: int = 0) -> None:
        super().__init__()
        self._conv = nn.Conv2d(c_in, c_out, kernel_size, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self._conv(x))


class _Fire(nn.Module):
    def __init__(self, c_in: int, squeeze: int, expand1x1: int, expand3x3: int) -> None:
        super().__init__()
        self._conv = _FireConv(c_in, squeeze, 1)
        self._conv_path1 = _FireConv(squeeze, expand1x1, 1)
        self._conv_path2 = _FireConv(squeeze, expand3x3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._conv(x)
        return torch.cat([self._conv_path1(x), self._conv_path2(x)], dim=1)


class SqueezeNet(nn.Module):
    """SqueezeNet as Paddle builds it.

    Args:
        version: ``"1.0"`` or ``"1.1"``.
        num_classes: output channels of the final 1x1 convolution ``_conv9``; ``<= 0`` leaves it out. Default 1000.
        with_pool: ReLU and global average pooling at the end (output ``(N, C)``). Default True.

    Example::

        net = SqueezeNet("1.1", num_classes=10)
        assert net(torch.randn(2, 3, 224, 224)).shape == (2, 10)
    """

    def __init__(self, version: str, num_classes: int = 1000, with_pool: bool = True) -> None:
        super().__init__()
        if version not in _POOL_AFTER:
            raise ValueError(f"SqueezeNet version={version!r}: supported versions are ['1.0', '1.1']")
        self.version, self.num_classes, self.with_pool = version, num_classes, with_pool
        if version == "1.0":
            self._conv = nn.Conv2d(3, 96, 7, stride=2)
        else:
            self._conv = nn.Conv2d(3, 64, 3, stride=2, padding=1)
        self._pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=0)
        c_in = self._conv.out_channels
        for i, (squeeze, expand) in enumerate(_FIRES, start=1):
            self.add_module(f"_conv{i}", _Fire(c_in, squeeze, expand, expand))
            c_in = 2 * expand
        if num_classes > 0:
            self._drop = DownscaleInInferDropout(0.5)
            self._conv9 = nn.Conv2d(512, num_classes, 1)
        if with_pool:
            self._avg_pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self._pool(F.relu(self._conv(inputs)))
        for i in range(1, len(_FIRES) + 1):
            x = getattr(self, f"_conv{i}")(x)
            if i in _POOL_AFTER[self.version]:
                x = self._pool(x)
        if self.num_classes > 0:
            x = self._conv9(self._drop(x))
        if self.with_pool:
            x = self._avg_pool(F.relu(x)).flatten(1)
        return x


def squeezenet1_0(pretrained: bool = False, **kwargs: Any) -> SqueezeNet:
    """SqueezeNet 1.0: ``SqueezeNet("1.0", **kwargs)``."""
    refuse_pretrained("squeezenet1_0", pretrained)
    return SqueezeNet("1.0", **kwargs)


def squeezenet1_1(pretrained: bool = False, **kwargs: Any) -> SqueezeNet:
    """SqueezeNet 1.1: ``SqueezeNet("1.1", **kwargs)``."""
    refuse_pretrained("squeezenet1_1", pretrained)
    return SqueezeNet("1.1", **kwargs)
