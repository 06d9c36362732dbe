"""Paddle's MobileNetV1 (``paddle.vision.models.MobileNetV1``); torchvision has none, so it is written here.

Layer names are Paddle's: ``conv1``, then depthwise-separable blocks
``conv2_1`` ... ``conv6``, each a ``_depthwise_conv`` and a
``_pointwise_conv`` (convolution without bias, BatchNorm, ReLU), then
``pool2d_avg`` and ``fc``. Needs torch only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._pretrained import refuse_pretrained

__all__ = ["MobileNetV1", "mobilenet_v1"]

# (name, in, out1, out2, groups, stride) of Paddle's blocks, channel counts before scaling
_BLOCKS = [("conv2_1", 32, 32, 64, 32, 1), ("conv2_2", 64, 64, 128, 64, 2), ("conv3_1", 128, 128, 128, 128, 1),
           ("conv3_2", 128, 128, 256, 128, 2), ("conv4_1", 256, 256, 256, 256, 1),
           ("conv4_2", 256, 256, 512, 256, 2),
           *[(f"conv5_{i}", 512, 512, 512, 512, 1) for i in range(1, 6)],
           ("conv5_6", 512, 512, 1024, 512, 2), ("conv6", 1024, 1024, 1024, 1024, 1)]


class _ConvBNReLU(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int, padding: int, groups: int = 1) -> None:
        super().__init__(nn.Conv2d(c_in, c_out, kernel_size, stride, padding, groups=groups, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU())


class DepthwiseSeparable(nn.Module):
    """A 3x3 depthwise convolution and a 1x1 pointwise one, each followed by BatchNorm and ReLU (Paddle's block)."""

    def __init__(self, in_channels: int, out_channels1: int, out_channels2: int, num_groups: int, stride: int,
                 scale: float) -> None:
        super().__init__()
        self._depthwise_conv = _ConvBNReLU(in_channels, int(out_channels1 * scale), 3, stride, 1,
                                           groups=int(num_groups * scale))
        self._pointwise_conv = _ConvBNReLU(int(out_channels1 * scale), int(out_channels2 * scale), 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pointwise_conv(self._depthwise_conv(x))


class MobileNetV1(nn.Module):
    """MobileNetV1 as Paddle builds it.

    Args:
        scale: channel multiplier of every layer. Default 1.0.
        num_classes: outputs of ``fc``; ``<= 0`` leaves it out. Default 1000.
        with_pool: global average pooling before ``fc``. Default True.

    Example::

        net = MobileNetV1(scale=0.25, num_classes=10)
        assert net(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    """

    def __init__(self, scale: float = 1.0, num_classes: int = 1000, with_pool: bool = True) -> None:
        super().__init__()
        self.scale = scale
        self.num_classes = num_classes
        self.with_pool = with_pool
        self.conv1 = _ConvBNReLU(3, int(32 * scale), 3, 2, 1)
        self._blocks = [name for name, *_ in _BLOCKS]
        for name, c_in, out1, out2, groups, stride in _BLOCKS:
            self.add_module(name, DepthwiseSeparable(int(c_in * scale), out1, out2, groups, stride, scale))
        if with_pool:
            self.pool2d_avg = nn.AdaptiveAvgPool2d(1)
        if num_classes > 0:
            self.fc = nn.Linear(int(1024 * scale), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for name in self._blocks:
            x = getattr(self, name)(x)
        if self.with_pool:
            x = self.pool2d_avg(x)
        if self.num_classes > 0:
            x = self.fc(torch.flatten(x, 1))
        return x


def mobilenet_v1(pretrained: bool = False, scale: float = 1.0, **kwargs: Any) -> MobileNetV1:
    """MobileNetV1 (4.23M parameters at ``scale=1.0`` with 1000 classes): ``MobileNetV1(scale, **kwargs)``."""
    refuse_pretrained(f"mobilenet_v1(scale={scale})", pretrained)
    return MobileNetV1(scale=scale, **kwargs)
