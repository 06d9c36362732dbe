"""Paddle's InceptionV3 (``paddle.vision.models.InceptionV3``) on torchvision's Inception3.

The blocks are torchvision's (parameter names too); as in Paddle there is no
auxiliary head and no input transform, BatchNorm uses Paddle's default
``eps=1e-5`` (torchvision: 1e-3), and the dropout before ``fc`` (p=0.2) is in
``downscale_in_infer`` mode. ``num_classes <= 0`` drops ``fc``,
``with_pool=False`` the pooling. Importing this module imports torchvision.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchvision.models import inception as _tv

from ._pretrained import refuse_pretrained
from .alexnet import DownscaleInInferDropout

__all__ = ["InceptionV3", "inception_v3"]


class InceptionV3(_tv.Inception3):
    """Inception v3 with Paddle's arguments, for 3x299x299 inputs.

    Args:
        num_classes: outputs of ``fc``; ``<= 0`` leaves it out. Default 1000.
        with_pool: global average pooling before ``fc``. Default True.

    Example::

        net = InceptionV3(num_classes=10)
        assert net(torch.randn(1, 3, 299, 299)).shape == (1, 10)
    """

    def __init__(self, num_classes: int = 1000, with_pool: bool = True) -> None:
        super().__init__(num_classes=max(int(num_classes), 1), aux_logits=False, transform_input=False,
                         init_weights=False)
        self.num_classes, self.with_pool = num_classes, with_pool
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps = 1e-5  # Paddle's BatchNorm default
        self.dropout = DownscaleInInferDropout(0.2)
        if not with_pool:
            del self.avgpool
        if num_classes <= 0:
            del self.fc, self.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1",
                     "Conv2d_4a_3x3", "maxpool2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
                     "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c"):
            x = getattr(self, name)(x)
        if self.with_pool:
            x = self.avgpool(x)
        if self.num_classes > 0:
            x = self.fc(self.dropout(torch.flatten(x, 1)))
        return x


def inception_v3(pretrained: bool = False, **kwargs: Any) -> InceptionV3:
    """Inception v3: ``InceptionV3(**kwargs)``."""
    refuse_pretrained("inception_v3", pretrained)
    return InceptionV3(**kwargs)
