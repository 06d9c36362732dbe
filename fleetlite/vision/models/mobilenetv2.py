"""Paddle's MobileNetV2 (``paddle.vision.models.MobileNetV2``) on torchvision's MobileNetV2.

Paddle's ``scale`` is torchvision's ``width_mult``; the layers (inverted
residuals with ReLU6, the 1280-channel head, dropout 0.2) and parameter names
(``features.N``, ``classifier.1``) are the same. Importing this module imports
torchvision.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchvision.models import mobilenetv2 as _tv

from ._pretrained import refuse_pretrained

__all__ = ["MobileNetV2", "mobilenet_v2"]


class MobileNetV2(_tv.MobileNetV2):
    """MobileNetV2 with Paddle's arguments.

    Args:
        scale: channel multiplier of every layer. Default 1.0.
        num_classes: outputs of the classifier; ``<= 0`` leaves it out. Default 1000.
        with_pool: global average pooling (``pool2d_avg``) after the features. Default True.

    Example::

        net = MobileNetV2(scale=0.5, num_classes=10)
        assert net(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    """

    def __init__(self, scale: float = 1.0, num_classes: int = 1000, with_pool: bool = True) -> None:
        super().__init__(num_classes=max(int(num_classes), 1), width_mult=scale)
        self.scale = scale
        self.num_classes = num_classes
        self.with_pool = with_pool
        if with_pool:
            self.pool2d_avg = nn.AdaptiveAvgPool2d(1)
        if num_classes <= 0:
            del self.classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        if self.with_pool:
            x = self.pool2d_avg(x)
        if self.num_classes > 0:
            x = self.classifier(torch.flatten(x, 1))
        return x


def mobilenet_v2(pretrained: bool = False, scale: float = 1.0, **kwargs: Any) -> MobileNetV2:
    """MobileNetV2 (3.50M parameters at ``scale=1.0`` with 1000 classes): ``MobileNetV2(scale, **kwargs)``."""
    refuse_pretrained(f"mobilenet_v2(scale={scale})", pretrained, "mobilenet_v2" if scale == 1.0 else None)
    return MobileNetV2(scale=scale, **kwargs)
