"""Paddle's AlexNet (``paddle.vision.models.AlexNet``), written here with Paddle's layer names.

The layer sizes are torchvision's AlexNet's (61.1M parameters), but Paddle
names its layers differently (``_conv1._conv``, ..., ``_fc8``), has no
adaptive pooling (inputs must be 224x224) and uses dropout in
``downscale_in_infer`` mode (no rescaling while training, outputs times
``1 - p`` in eval), so it is its own module. Needs torch only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._pretrained import refuse_pretrained

__all__ = ["AlexNet", "alexnet"]


class _ConvPool(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int, padding: int) -> None:
        super().__init__()
        self._conv = nn.Conv2d(c_in, c_out, kernel_size, stride, padding)
        self.relu = nn.ReLU()
        self._pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pool(self.relu(self._conv(x)))


class DownscaleInInferDropout(nn.Module):
    """Paddle's ``Dropout(p, mode="downscale_in_infer")``: training zeroes elements without rescaling the
    others; eval multiplies by ``1 - p``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.p, self.training) * (1 - self.p)


class AlexNet(nn.Module):
    """AlexNet as Paddle builds it, for 3x224x224 inputs.

    Args:
        num_classes: outputs of ``_fc8``; ``<= 0`` leaves the three linear
            layers out (the output is the ``(N, 256, 6, 6)`` features). Default 1000.

    Example::

        net = AlexNet(num_classes=10)
        assert net(torch.randn(1, 3, 224, 224)).shape == (1, 10)
    """

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.num_classes = num_classes
        self._conv1 = _ConvPool(3, 64, 11, 4, 2)
        self._conv2 = _ConvPool(64, 192, 5, 1, 2)
        self._conv3 = nn.Conv2d(192, 384, 3, stride=1, padding=1)
        self._conv4 = nn.Conv2d(384, 256, 3, stride=1, padding=1)
        self._conv5 = _ConvPool(256, 256, 3, 1, 1)
        if num_classes > 0:
            self._drop1 = DownscaleInInferDropout(0.5)
            self._fc6 = nn.Linear(256 * 6 * 6, 4096)
            self._drop2 = DownscaleInInferDropout(0.5)
            self._fc7 = nn.Linear(4096, 4096)
            self._fc8 = nn.Linear(4096, num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self._conv2(self._conv1(inputs))
        x = self._conv5(F.relu(self._conv4(F.relu(self._conv3(x)))))
        if self.num_classes > 0:
            x = F.relu(self._fc6(self._drop1(torch.flatten(x, 1))))
            x = self._fc8(F.relu(self._fc7(self._drop2(x))))
        return x


def alexnet(pretrained: bool = False, **kwargs: Any) -> AlexNet:
    """AlexNet (61.10M parameters with 1000 classes): ``AlexNet(**kwargs)``."""
    refuse_pretrained("alexnet", pretrained)
    return AlexNet(**kwargs)
