"""Paddle's VGG family (``paddle.vision.models.vgg``) on torchvision's VGG.

Same layers and parameter names as torchvision's (``features.N``,
``classifier.0/3/6``) and Paddle's; ``num_classes <= 0`` drops the
classifier and ``with_pool=False`` the 7x7 adaptive pooling, as in Paddle.
Importing this module imports torchvision.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchvision.models import vgg as _tv

from ._pretrained import refuse_pretrained

__all__ = ["VGG", "make_layers", "vgg11", "vgg13", "vgg16", "vgg19"]

#: Paddle's (and torchvision's) layer tables: channel counts and "M" for a 2x2 max-pool.
cfgs: dict[str, list[int | str]] = {k: list(v) for k, v in _tv.cfgs.items()}


def make_layers(cfg: list[int | str], batch_norm: bool = False) -> nn.Sequential:
    """The convolutional ``features`` of a VGG from a table such as ``cfgs["D"]`` (3x3 convs, ReLU, max-pools)."""
    return _tv.make_layers(cfg, batch_norm=batch_norm)


class VGG(_tv.VGG):
    """VGG as ``paddle.vision.models.VGG``: ``features``, 7x7 adaptive average pool, three linear layers.

    Args:
        features: the convolutional part, e.g. ``make_layers(cfgs["D"])``.
        num_classes: outputs of the last linear layer; ``<= 0`` leaves the classifier out. Default 1000.
        with_pool: the 7x7 adaptive average pool before the classifier. Default True.

    Example::

        net = VGG(make_layers([64, "M", 128, "M"]), num_classes=0)
        assert net(torch.randn(1, 3, 32, 32)).shape == (1, 128, 7, 7)
    """

    def __init__(self, features: nn.Module, num_classes: int = 1000, with_pool: bool = True) -> None:
        super().__init__(features, num_classes=max(int(num_classes), 1))
        self.num_classes = num_classes
        self.with_pool = with_pool
        if not with_pool:
            del self.avgpool
        if num_classes <= 0:
            del self.classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        if self.with_pool:
            x = self.avgpool(x)
        if self.num_classes > 0:
            x = self.classifier(torch.flatten(x, 1))
        return x


def _vgg(arch: str, cfg: str, batch_norm: bool, pretrained: bool, **kwargs: Any) -> VGG:
    name = arch + ("_bn" if batch_norm else "")
    refuse_pretrained(name, pretrained, name)
    return VGG(make_layers(cfgs[cfg], batch_norm=batch_norm), **kwargs)


def vgg11(pretrained: bool = False, batch_norm: bool = False, **kwargs: Any) -> VGG:
    """VGG-11 (configuration "A"), with BatchNorm after each convolution when ``batch_norm``."""
    return _vgg("vgg11", "A", batch_norm, pretrained, **kwargs)


def vgg13(pretrained: bool = False, batch_norm: bool = False, **kwargs: Any) -> VGG:
    """VGG-13 (configuration "B"), with BatchNorm after each convolution when ``batch_norm``."""
    return _vgg("vgg13", "B", batch_norm, pretrained, **kwargs)


def vgg16(pretrained: bool = False, batch_norm: bool = False, **kwargs: Any) -> VGG:
    """VGG-16 (configuration "D"; 138.36M parameters with 1000 classes), BatchNorm when ``batch_norm``."""
    return _vgg("vgg16", "D", batch_norm, pretrained, **kwargs)


def vgg19(pretrained: bool = False, batch_norm: bool = False, **kwargs: Any) -> VGG:
    """VGG-19 (configuration "E"), with BatchNorm after each convolution when ``batch_norm``."""
    return _vgg("vgg19", "E", batch_norm, pretrained, **kwargs)
