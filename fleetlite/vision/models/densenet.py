"""Paddle's DenseNet family (``paddle.vision.models.densenet``) on torchvision's DenseNet.

Paddle's network is torchvision's (BN-ReLU-conv dense layers, transitions
with 2x2 average pooling, a final BN + ReLU), chosen by ``layers`` (121, 161,
169, 201 or 264); parameter names are torchvision's. One difference: with
``dropout > 0`` the dense layers use torch's inverted dropout (scaled while
training) where Paddle scales at inference; the default ``dropout=0.0`` is
exact. Importing this module imports torchvision.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import densenet as _tv

from ._pretrained import refuse_pretrained

__all__ = ["DenseNet", "densenet121", "densenet161", "densenet169", "densenet201", "densenet264"]

# layers: (num_init_features, growth_rate, block_config), Paddle's table
_SPECS = {121: (64, 32, (6, 12, 24, 16)), 161: (96, 48, (6, 12, 36, 24)), 169: (64, 32, (6, 12, 32, 32)),
          201: (64, 32, (6, 12, 48, 32)), 264: (64, 32, (6, 12, 64, 48))}


class DenseNet(_tv.DenseNet):
    """DenseNet with Paddle's arguments.

    Args:
        layers: 121, 161, 169, 201 or 264. Default 121.
        bn_size: bottleneck width factor of each dense layer. Default 4.
        dropout: dropout rate after each dense layer. Default 0.0.
        num_classes: outputs of the classifier; ``<= 0`` leaves it out. Default 1000.
        with_pool: global average pooling after the features. Default True.

    Example::

        net = DenseNet(layers=121, num_classes=10)
        assert net(torch.randn(1, 3, 64, 64)).shape == (1, 10)
    """

    def __init__(self, layers: int = 121, bn_size: int = 4, dropout: float = 0.0, num_classes: int = 1000,
                 with_pool: bool = True) -> None:
        if layers not in _SPECS:
            raise ValueError(f"DenseNet layers={layers!r}: supported layers are {sorted(_SPECS)}")
        init, growth, blocks = _SPECS[layers]
        super().__init__(growth_rate=growth, block_config=blocks, num_init_features=init, bn_size=bn_size,
                         drop_rate=dropout, num_classes=max(int(num_classes), 1))
        self.num_classes, self.with_pool = num_classes, with_pool
        if with_pool:
            self.pool2d_avg = nn.AdaptiveAvgPool2d(1)
        if num_classes <= 0:
            del self.classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.features(x))
        if self.with_pool:
            x = self.pool2d_avg(x)
        if self.num_classes > 0:
            x = self.classifier(torch.flatten(x, 1))
        return x


def _densenet(layers: int, pretrained: bool, **kwargs: Any) -> DenseNet:
    arch = f"densenet{layers}"
    refuse_pretrained(arch, pretrained, arch if arch in _tv.__all__ else None)
    return DenseNet(layers=layers, **kwargs)


def densenet121(pretrained: bool = False, **kwargs: Any) -> DenseNet:
    """DenseNet-121: ``DenseNet(layers=121, **kwargs)``."""
    return _densenet(121, pretrained, **kwargs)


def densenet161(pretrained: bool = False, **kwargs: Any) -> DenseNet:
    """DenseNet-161: ``DenseNet(layers=161, **kwargs)``."""
    return _densenet(161, pretrained, **kwargs)


def densenet169(pretrained: bool = False, **kwargs: Any) -> DenseNet:
    """DenseNet-169: ``DenseNet(layers=169, **kwargs)``."""
    return _densenet(169, pretrained, **kwargs)


def densenet201(pretrained: bool = False, **kwargs: Any) -> DenseNet:
    """DenseNet-201: ``DenseNet(layers=201, **kwargs)``."""
    return _densenet(201, pretrained, **kwargs)


def densenet264(pretrained: bool = False, **kwargs: Any) -> DenseNet:
    """DenseNet-264 (Paddle's; torchvision has none): ``DenseNet(layers=264, **kwargs)``."""
    return _densenet(264, pretrained, **kwargs)
