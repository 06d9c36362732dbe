"""Paddle's ShuffleNetV2 (``paddle.vision.models.ShuffleNetV2``), written here with Paddle's layer names.

The same network as torchvision's ShuffleNetV2 (same layers, in the same
order, so torchvision's weights copy across in order), with Paddle's names
(``_conv1``, ``2_1`` ... ``4_4``, ``_last_conv``, ``_fc``), Paddle's extra
scales (0.25, 0.33) and its ``act="swish"`` variant. Needs torch only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._pretrained import refuse_pretrained

__all__ = ["ShuffleNetV2", "shufflenet_v2_x0_25", "shufflenet_v2_x0_33", "shufflenet_v2_x0_5", "shufflenet_v2_x1_0",
           "shufflenet_v2_x1_5", "shufflenet_v2_x2_0", "shufflenet_v2_swish"]

_CHANNELS = {0.25: [24, 24, 48, 96, 512], 0.33: [24, 32, 64, 128, 512], 0.5: [24, 48, 96, 192, 1024],
             1.0: [24, 116, 232, 464, 1024], 1.5: [24, 176, 352, 704, 1024], 2.0: [24, 224, 488, 976, 2048]}
_ACTS = {"relu": nn.ReLU, "swish": nn.SiLU}


def _conv_bn(c_in: int, c_out: int, kernel_size: int, stride: int, groups: int, act: type | None) -> nn.Sequential:
    layers = [nn.Conv2d(c_in, c_out, kernel_size, stride, kernel_size // 2, groups=groups, bias=False),
              nn.BatchNorm2d(c_out)]
    return nn.Sequential(*layers, act()) if act is not None else nn.Sequential(*layers)


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Interleave the channels of ``groups`` groups (ShuffleNet's channel shuffle)."""
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class _InvertedResidual(nn.Module):
    def __init__(self, channels: int, act: type) -> None:
        super().__init__()
        half = channels // 2
        self._conv_pw = _conv_bn(half, half, 1, 1, 1, act)
        self._conv_dw = _conv_bn(half, half, 3, 1, half, None)
        self._conv_linear = _conv_bn(half, half, 1, 1, 1, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=1)
        return channel_shuffle(torch.cat([x1, self._conv_linear(self._conv_dw(self._conv_pw(x2)))], 1), 2)


class _InvertedResidualDS(nn.Module):
    def __init__(self, c_in: int, c_out: int, act: type) -> None:
        super().__init__()
        half = c_out // 2
        self._conv_dw_1 = _conv_bn(c_in, c_in, 3, 2, c_in, None)
        self._conv_linear_1 = _conv_bn(c_in, half, 1, 1, 1, act)
        self._conv_pw_2 = _conv_bn(c_in, half, 1, 1, 1, act)
        self._conv_dw_2 = _conv_bn(half, half, 3, 2, half, None)
        self._conv_linear_2 = _conv_bn(half, half, 1, 1, 1, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self._conv_linear_1(self._conv_dw_1(x))
        x2 = self._conv_linear_2(self._conv_dw_2(self._conv_pw_2(x)))
        return channel_shuffle(torch.cat([x1, x2], 1), 2)


class ShuffleNetV2(nn.Module):
    """ShuffleNetV2 as Paddle builds it.

    Args:
        scale: 0.25, 0.33, 0.5, 1.0, 1.5 or 2.0 (channel widths). Default 1.0.
        act: ``"relu"`` or ``"swish"``. Default ``"relu"``.
        num_classes: outputs of ``_fc``; ``<= 0`` leaves it out. Default 1000.
        with_pool: global average pooling before ``_fc``. Default True.

    Example::

        net = ShuffleNetV2(scale=0.5, num_classes=10)
        assert net(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    """

    def __init__(self, scale: float = 1.0, act: str = "relu", num_classes: int = 1000, with_pool: bool = True) -> None:
        super().__init__()
        if scale not in _CHANNELS:
            raise NotImplementedError(f"ShuffleNetV2 scale={scale!r} is not implemented (Paddle's scales: "
                                      f"{sorted(_CHANNELS)})")
        if act not in _ACTS:
            raise ValueError(f"ShuffleNetV2 act={act!r}: expected one of {sorted(_ACTS)}")
        self.scale, self.num_classes, self.with_pool = scale, num_classes, with_pool
        activation, channels = _ACTS[act], _CHANNELS[scale]
        self._conv1 = _conv_bn(3, channels[0], 3, 2, 1, activation)
        self._max_pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self._blocks = []
        for stage, repeats in enumerate([4, 8, 4]):
            for i in range(repeats):
                name = f"{stage + 2}_{i + 1}"
                block = (_InvertedResidualDS(channels[stage], channels[stage + 1], activation) if i == 0
                         else _InvertedResidual(channels[stage + 1], activation))
                self.add_module(name, block)
                self._blocks.append(name)
        self._last_conv = _conv_bn(channels[-2], channels[-1], 1, 1, 1, activation)
        if with_pool:
            self._pool2d_avg = nn.AdaptiveAvgPool2d(1)
        if num_classes > 0:
            self._fc = nn.Linear(channels[-1], num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self._max_pool(self._conv1(inputs))
        for name in self._blocks:
            x = getattr(self, name)(x)
        x = self._last_conv(x)
        if self.with_pool:
            x = self._pool2d_avg(x)
        if self.num_classes > 0:
            x = self._fc(torch.flatten(x, 1))
        return x


def _shufflenet(arch: str, pretrained: bool, **kwargs: Any) -> ShuffleNetV2:
    refuse_pretrained(arch, pretrained)
    return ShuffleNetV2(**kwargs)


def shufflenet_v2_x0_25(pretrained: bool = False, **kwargs: Any) -> ShuffleNetV2:
    """ShuffleNetV2 0.25x: ``ShuffleNetV2(scale=0.25, **kwargs)``."""
    return _shufflenet("shufflenet_v2_x0_25", pretrained, scale=0.25, **kwargs)


def shufflenet_v2_x0_33(pretrained: bool = False, **kwargs: Any) -> ShuffleNetV2:
    """ShuffleNetV2 0.33x: ``ShuffleNetV2(scale=0.33, **kwargs)``."""
    return _shufflenet("shufflenet_v2_x0_33", pretrained, scale=0.33, **kwargs)


def shufflenet_v2_x0_5(pretrained: bool = False, **kwargs: Any) -> ShuffleNetV2:
    """ShuffleNetV2 0.5x: ``ShuffleNetV2(scale=0.5, **kwargs)``."""
    return _shufflenet("shufflenet_v2_x0_5", pretrained, scale=0.5, **kwargs)


def shufflenet_v2_x1_0(pretrained: bool = False, **kwargs: Any) -> ShuffleNetV2:
    """ShuffleNetV2 1.0x: ``ShuffleNetV2(scale=1.0, **kwargs)``."""
    return _shufflenet("shufflenet_v2_x1_0", pretrained, scale=1.0, **kwargs)


def shufflenet_v2_x1_5(pretrained: bool = False, **kwargs: Any) -> ShuffleNetV2:
    """ShuffleNetV2 1.5x: ``ShuffleNetV2(scale=1.5, **kwargs)``."""
    return _shufflenet("shufflenet_v2_x1_5", pretrained, scale=1.5, **kwargs)


def shufflenet_v2_x2_0(pretrained: bool = False, **kwargs: Any) -> ShuffleNetV2:
    """ShuffleNetV2 2.0x: ``ShuffleNetV2(scale=2.0, **kwargs)``."""
    return _shufflenet("shufflenet_v2_x2_0", pretrained, scale=2.0, **kwargs)


def shufflenet_v2_swish(pretrained: bool = False, **kwargs: Any) -> ShuffleNetV2:
    """ShuffleNetV2 1.0x with swish: ``ShuffleNetV2(scale=1.0, act="swish", **kwargs)``."""
    return _shufflenet("shufflenet_v2_swish", pretrained, scale=1.0, act="swish", **kwargs)
