"""Paddle's ResNet family (``paddle.vision.models.resnet``) on torchvision's ResNet.

Paddle's ``ResNet`` is torchvision's architecture with other constructor
arguments: ``depth`` picks the stage sizes, ``width`` is torchvision's
``width_per_group`` and ``groups`` its ``groups`` (ResNeXt, wide ResNets),
``num_classes <= 0`` drops ``fc`` and ``with_pool=False`` drops ``avgpool``.
Parameter names are torchvision's, which are Paddle's too (``conv1``, ``bn1``,
``layer1.0.conv1``, ..., ``fc``). Importing this module imports torchvision.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchvision.models import resnet as _tv

from ._pretrained import refuse_pretrained

__all__ = ["ResNet", "BasicBlock", "BottleneckBlock", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
           "resnext50_32x4d", "resnext50_64x4d", "resnext101_32x4d", "resnext101_64x4d", "resnext152_32x4d",
           "resnext152_64x4d", "wide_resnet50_2", "wide_resnet101_2"]

_STAGES = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}


class BasicBlock(_tv.BasicBlock):
    """Two 3x3 convolutions (ResNet-18/34), Paddle's signature; like Paddle it ignores ``groups`` and ``base_width``."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 groups: int = 1, base_width: int = 64, dilation: int = 1, norm_layer: Any = None) -> None:
        if dilation > 1:
            raise NotImplementedError(f"BasicBlock: dilation={dilation} > 1 is not supported (as in Paddle); use "
                                      "BottleneckBlock for dilated ResNets")
        super().__init__(inplanes, planes, stride, downsample, 1, 64, 1, norm_layer)


class BottleneckBlock(_tv.Bottleneck):
    """1x1, 3x3 (grouped), 1x1 convolutions with expansion 4 (ResNet-50/101/152, ResNeXt); Paddle's signature."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 groups: int = 1, base_width: int = 64, dilation: int = 1, norm_layer: Any = None) -> None:
        super().__init__(inplanes, planes, stride, downsample, groups, base_width, dilation, norm_layer)


class ResNet(_tv.ResNet):
    """ResNet as ``paddle.vision.models.ResNet``: torchvision's network with Paddle's arguments.

    Args:
        block: :class:`BasicBlock` or :class:`BottleneckBlock` (or a class with their signature).
        depth: 18, 34, 50, 101 or 152. Default 50.
        width: base width per convolution group (torchvision's ``width_per_group``). Default 64.
        num_classes: outputs of ``fc``; ``<= 0`` leaves ``fc`` out (the output is the pooled features). Default 1000.
        with_pool: global average pooling before ``fc``. Default True.
        groups: convolution groups in each bottleneck (ResNeXt). Default 1.

    Example::

        net = ResNet(BottleneckBlock, 50)                 # Paddle: ResNet(BottleneckBlock, 50)
        assert net(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
        features = ResNet(BasicBlock, 18, num_classes=0, with_pool=False)
        assert features(torch.randn(1, 3, 64, 64)).shape == (1, 512, 2, 2)
    """

    def __init__(self, block: type[nn.Module], depth: int = 50, width: int = 64, num_classes: int = 1000,
                 with_pool: bool = True, groups: int = 1) -> None:
        if depth not in _STAGES:
            raise ValueError(f"ResNet depth={depth!r} is not one of {sorted(_STAGES)} (Paddle's supported depths)")
        super().__init__(block, _STAGES[depth], num_classes=max(int(num_classes), 1), groups=groups,
                         width_per_group=width)
        self.num_classes = num_classes
        self.with_pool = with_pool
        if not with_pool:
            del self.avgpool
        if num_classes <= 0:
            del self.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        if self.with_pool:
            x = self.avgpool(x)
        if self.num_classes > 0:
            x = self.fc(torch.flatten(x, 1))
        return x


def _resnet(arch: str, block: type[nn.Module], depth: int, pretrained: bool, **kwargs: Any) -> ResNet:
    refuse_pretrained(arch, pretrained, arch if arch in _tv.__all__ else None)
    return ResNet(block, depth, **kwargs)


def resnet18(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNet-18: ``ResNet(BasicBlock, 18, **kwargs)``."""
    return _resnet("resnet18", BasicBlock, 18, pretrained, **kwargs)


def resnet34(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNet-34: ``ResNet(BasicBlock, 34, **kwargs)``."""
    return _resnet("resnet34", BasicBlock, 34, pretrained, **kwargs)


def resnet50(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNet-50: ``ResNet(BottleneckBlock, 50, **kwargs)`` (25.56M parameters with 1000 classes)."""
    return _resnet("resnet50", BottleneckBlock, 50, pretrained, **kwargs)


def resnet101(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNet-101: ``ResNet(BottleneckBlock, 101, **kwargs)``."""
    return _resnet("resnet101", BottleneckBlock, 101, pretrained, **kwargs)


def resnet152(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNet-152: ``ResNet(BottleneckBlock, 152, **kwargs)``."""
    return _resnet("resnet152", BottleneckBlock, 152, pretrained, **kwargs)


def _resnext(arch: str, depth: int, groups: int, pretrained: bool, kwargs: dict) -> ResNet:
    kwargs["groups"], kwargs["width"] = groups, 4  # Paddle overrides both, whatever was passed
    return _resnet(arch, BottleneckBlock, depth, pretrained, **kwargs)


def resnext50_32x4d(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNeXt-50 32x4d: ``ResNet(BottleneckBlock, 50, width=4, groups=32, **kwargs)``."""
    return _resnext("resnext50_32x4d", 50, 32, pretrained, kwargs)


def resnext50_64x4d(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNeXt-50 64x4d: ``ResNet(BottleneckBlock, 50, width=4, groups=64, **kwargs)``."""
    return _resnext("resnext50_64x4d", 50, 64, pretrained, kwargs)


def resnext101_32x4d(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNeXt-101 32x4d: ``ResNet(BottleneckBlock, 101, width=4, groups=32, **kwargs)``."""
    return _resnext("resnext101_32x4d", 101, 32, pretrained, kwargs)


def resnext101_64x4d(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNeXt-101 64x4d: ``ResNet(BottleneckBlock, 101, width=4, groups=64, **kwargs)``."""
    return _resnext("resnext101_64x4d", 101, 64, pretrained, kwargs)


def resnext152_32x4d(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNeXt-152 32x4d: ``ResNet(BottleneckBlock, 152, width=4, groups=32, **kwargs)``."""
    return _resnext("resnext152_32x4d", 152, 32, pretrained, kwargs)


def resnext152_64x4d(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """ResNeXt-152 64x4d: ``ResNet(BottleneckBlock, 152, width=4, groups=64, **kwargs)``."""
    return _resnext("resnext152_64x4d", 152, 64, pretrained, kwargs)


def wide_resnet50_2(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """Wide ResNet-50-2: ``ResNet(BottleneckBlock, 50, width=128, **kwargs)``."""
    kwargs["width"] = 64 * 2
    return _resnet("wide_resnet50_2", BottleneckBlock, 50, pretrained, **kwargs)


def wide_resnet101_2(pretrained: bool = False, **kwargs: Any) -> ResNet:
    """Wide ResNet-101-2: ``ResNet(BottleneckBlock, 101, width=128, **kwargs)``."""
    kwargs["width"] = 64 * 2
    return _resnet("wide_resnet101_2", BottleneckBlock, 101, pretrained, **kwargs)
