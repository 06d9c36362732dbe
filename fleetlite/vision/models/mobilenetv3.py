"""Paddle's MobileNetV3 (``paddle.vision.models.MobileNetV3Small/Large``), written here with Paddle's layer names.

Paddle's network is not torchvision's: a squeeze-excitation of ``channels // 4``
with a hard sigmoid of slope 0.2, a 1x1 ``last_conv`` (no bias) to
``last_channel`` = 1280 channels after the pooling for both sizes, and dropout in
``downscale_in_infer`` mode; so it is its own module. Needs torch only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._pretrained import refuse_pretrained
from .alexnet import DownscaleInInferDropout

__all__ = ["MobileNetV3Small", "MobileNetV3Large", "mobilenet_v3_small", "mobilenet_v3_large"]

# (in, kernel, expanded, out, use_se, activation, stride) per block, before scaling: Paddle's tables
_SMALL = [(16, 3, 16, 16, True, "relu", 2), (16, 3, 72, 24, False, "relu", 2), (24, 3, 88, 24, False, "relu", 1),
          (24, 5, 96, 40, True, "hardswish", 2), (40, 5, 240, 40, True, "hardswish", 1),
          (40, 5, 240, 40, True, "hardswish", 1), (40, 5, 120, 48, True, "hardswish", 1),
          (48, 5, 144, 48, True, "hardswish", 1), (48, 5, 288, 96, True, "hardswish", 2),
          (96, 5, 576, 96, True, "hardswish", 1), (96, 5, 576, 96, True, "hardswish", 1)]
_LARGE = [(16, 3, 16, 16, False, "relu", 1), (16, 3, 64, 24, False, "relu", 2), (24, 3, 72, 24, False, "relu", 1),
          (24, 5, 72, 40, True, "relu", 2), (40, 5, 120, 40, True, "relu", 1), (40, 5, 120, 40, True, "relu", 1),
          (40, 3, 240, 80, False, "hardswish", 2), (80, 3, 200, 80, False, "hardswish", 1),
          (80, 3, 184, 80, False, "hardswish", 1), (80, 3, 184, 80, False, "hardswish", 1),
          (80, 3, 480, 112, True, "hardswish", 1), (112, 3, 672, 112, True, "hardswish", 1),
          (112, 5, 672, 160, True, "hardswish", 2), (160, 5, 960, 160, True, "hardswish", 1),
          (160, 5, 960, 160, True, "hardswish", 1)]


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class _ConvBN(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int, padding: int, groups: int = 1,
                 act: str | None = None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size, stride, padding, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.act = {"relu": nn.ReLU(), "hardswish": nn.Hardswish(), None: None}[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn(self.conv(x))
        return x if self.act is None else self.act(x)


class _SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.conv1 = nn.Conv2d(channels, channels // reduction, 1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.conv2(self.relu(self.conv1(self.avg_pool(x))))
        return x * torch.clamp(0.2 * scale + 0.5, 0.0, 1.0)  # Paddle's hardsigmoid(slope=0.2, offset=0.5)


class _InvertedResidual(nn.Module):
    def __init__(self, c_in: int, expanded: int, c_out: int, kernel: int, stride: int, use_se: bool,
                 act: str) -> None:
        super().__init__()
        self.if_shortcut = stride == 1 and c_in == c_out
        self.expand_conv = _ConvBN(c_in, expanded, 1, 1, 0, act=act)
        self.bottleneck_conv = _ConvBN(expanded, expanded, kernel, stride, (kernel - 1) // 2, groups=expanded,
                                       act=act)
        self.mid_se = _SqueezeExcitation(expanded) if use_se else None
        self.linear_conv = _ConvBN(expanded, c_out, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bottleneck_conv(self.expand_conv(x))
        if self.mid_se is not None:
            y = self.mid_se(y)
        y = self.linear_conv(y)
        return x + y if self.if_shortcut else y


class _MobileNetV3(nn.Module):
    def __init__(self, config: list[tuple], scale: float, last_channel: int, num_classes: int,
                 with_pool: bool) -> None:
        super().__init__()
        self.scale, self.last_channel, self.num_classes, self.with_pool = scale, last_channel, num_classes, with_pool
        d = lambda c: _make_divisible(scale * c)  # noqa: E731
        self.conv = _ConvBN(3, d(config[0][0]), 3, 2, 1, act="hardswish")
        self.blocks = nn.Sequential(*[_InvertedResidual(d(c_in), d(exp), d(c_out), k, s, se, act)
                                      for c_in, k, exp, c_out, se, act, s in config])
        last_expanded = d(config[-1][2])
        self.last_second_conv = _ConvBN(d(config[-1][3]), last_expanded, 1, 1, 0, act="hardswish")
        if with_pool:
            self.avg_pool = nn.AdaptiveAvgPool2d(1)
        if num_classes > 0:
            self.last_conv = nn.Conv2d(last_expanded, last_channel, 1, bias=False)
            self.hardswish = nn.Hardswish()
            self.dropout = DownscaleInInferDropout(0.2)
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(last_channel, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.last_second_conv(self.blocks(self.conv(x)))
        if self.with_pool:
            x = self.avg_pool(x)
        if self.num_classes > 0:
            x = self.fc(self.flatten(self.dropout(self.hardswish(self.last_conv(x)))))
        return x


class MobileNetV3Small(_MobileNetV3):
    """MobileNetV3-Small as Paddle builds it.

    Args:
        scale: channel multiplier. Default 1.0.
        last_channel: channels of the layer before ``fc``. Default 1280.
        num_classes: outputs of ``fc``; ``<= 0`` leaves the head out. Default 1000.
        with_pool: global average pooling before the head. Default True.

    Example::

        net = MobileNetV3Small(num_classes=10)
        assert net(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    """

    def __init__(self, scale: float = 1.0, last_channel: int = 1280, num_classes: int = 1000,
                 with_pool: bool = True) -> None:
        super().__init__(_SMALL, scale, last_channel, num_classes, with_pool)


class MobileNetV3Large(_MobileNetV3):
    """MobileNetV3-Large as Paddle builds it; same arguments as :class:`MobileNetV3Small`.

    Example::

        net = MobileNetV3Large(scale=0.5, num_classes=0)
        assert net(torch.randn(1, 3, 64, 64)).shape == (1, 480, 1, 1)
    """

    def __init__(self, scale: float = 1.0, last_channel: int = 1280, num_classes: int = 1000,
                 with_pool: bool = True) -> None:
        super().__init__(_LARGE, scale, last_channel, num_classes, with_pool)


def mobilenet_v3_small(pretrained: bool = False, scale: float = 1.0, **kwargs: Any) -> MobileNetV3Small:
    """MobileNetV3-Small: ``MobileNetV3Small(scale, **kwargs)``."""
    refuse_pretrained(f"mobilenet_v3_small(scale={scale})", pretrained)
    return MobileNetV3Small(scale=scale, **kwargs)


def mobilenet_v3_large(pretrained: bool = False, scale: float = 1.0, **kwargs: Any) -> MobileNetV3Large:
    """MobileNetV3-Large: ``MobileNetV3Large(scale, **kwargs)``."""
    refuse_pretrained(f"mobilenet_v3_large(scale={scale})", pretrained)
    return MobileNetV3Large(scale=scale, **kwargs)
