"""Paddle's GoogLeNet (``paddle.vision.models.GoogLeNet``), written here with Paddle's layer names.

Paddle's GoogLeNet is not torchvision's: its convolutions have no bias and no
BatchNorm (the stem has no activation; each inception block applies ReLU to its
concatenated output), and it always returns three outputs ``(out, out1,
out2)``: the main head and the two auxiliary heads (on ``_ince4a`` and
``_ince4d``). Needs torch only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._pretrained import refuse_pretrained
from .alexnet import DownscaleInInferDropout

__all__ = ["GoogLeNet", "googlenet"]


class _ConvLayer(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int = 1) -> None:
        super().__init__()
        self._conv = nn.Conv2d(c_in, c_out, kernel_size, stride, padding=(kernel_size - 1) // 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv(x)


class _Inception(nn.Module):
    def __init__(self, c_in: int, filter1: int, filter3r: int, filter3: int, filter5r: int, filter5: int,
                 proj: int) -> None:
        super().__init__()
        self._conv1 = _ConvLayer(c_in, filter1, 1)
        self._conv3r = _ConvLayer(c_in, filter3r, 1)
        self._conv3 = _ConvLayer(filter3r, filter3, 3)
        self._conv5r = _ConvLayer(c_in, filter5r, 1)
        self._conv5 = _ConvLayer(filter5r, filter5, 5)
        self._pool = nn.MaxPool2d(kernel_size=3, stride=1, padding=1)
        self._convprj = _ConvLayer(c_in, proj, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = [self._conv1(x), self._conv3(self._conv3r(x)), self._conv5(self._conv5r(x)),
                    self._convprj(self._pool(x))]
        return F.relu(torch.cat(branches, dim=1))


class GoogLeNet(nn.Module):
    """GoogLeNet (Inception v1) as Paddle builds it; ``forward`` returns ``(out, out1, out2)``.

    Args:
        num_classes: outputs of each head; ``<= 0`` leaves the heads out (the
            three outputs are then the pooled features). Default 1000.
        with_pool: the pooling before each head. Default True.

    Example::

        out, out1, out2 = GoogLeNet(num_classes=10)(torch.randn(1, 3, 224, 224))
        assert out.shape == out1.shape == out2.shape == (1, 10)
    """

    def __init__(self, num_classes: int = 1000, with_pool: bool = True) -> None:
        super().__init__()
        self.num_classes, self.with_pool = num_classes, with_pool
        self._conv = _ConvLayer(3, 64, 7, 2)
        self._pool = nn.MaxPool2d(kernel_size=3, stride=2)
        self._conv_1 = _ConvLayer(64, 64, 1)
        self._conv_2 = _ConvLayer(64, 192, 3)
        self._ince3a = _Inception(192, 64, 96, 128, 16, 32, 32)
        self._ince3b = _Inception(256, 128, 128, 192, 32, 96, 64)
        self._ince4a = _Inception(480, 192, 96, 208, 16, 48, 64)
        self._ince4b = _Inception(512, 160, 112, 224, 24, 64, 64)
        self._ince4c = _Inception(512, 128, 128, 256, 24, 64, 64)
        self._ince4d = _Inception(512, 112, 144, 288, 32, 64, 64)
        self._ince4e = _Inception(528, 256, 160, 320, 32, 128, 128)
        self._ince5a = _Inception(832, 256, 160, 320, 32, 128, 128)
        self._ince5b = _Inception(832, 384, 192, 384, 48, 128, 128)
        if with_pool:
            self._pool_5 = nn.AdaptiveAvgPool2d(1)
            self._pool_o1 = nn.AvgPool2d(kernel_size=5, stride=3)
            self._pool_o2 = nn.AvgPool2d(kernel_size=5, stride=3)
        if num_classes > 0:
            self._drop = DownscaleInInferDropout(0.4)
            self._fc_out = nn.Linear(1024, num_classes)
            self._conv_o1 = _ConvLayer(512, 128, 1)
            self._fc_o1 = nn.Linear(1152, 1024)
            self._drop_o1 = DownscaleInInferDropout(0.7)
            self._out1 = nn.Linear(1024, num_classes)
            self._conv_o2 = _ConvLayer(528, 128, 1)
            self._fc_o2 = nn.Linear(1152, 1024)
            self._drop_o2 = DownscaleInInferDropout(0.7)
            self._out2 = nn.Linear(1024, num_classes)

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self._pool(self._conv_2(self._conv_1(self._pool(self._conv(inputs)))))
        x = self._pool(self._ince3b(self._ince3a(x)))
        ince4a = self._ince4a(x)
        ince4d = self._ince4d(self._ince4c(self._ince4b(ince4a)))
        x = self._pool(self._ince4e(ince4d))
        out, out1, out2 = self._ince5b(self._ince5a(x)), ince4a, ince4d
        if self.with_pool:
            out, out1, out2 = self._pool_5(out), self._pool_o1(out1), self._pool_o2(out2)
        if self.num_classes > 0:
            out = self._fc_out(torch.flatten(self._drop(out), 1))
            out1 = self._out1(self._drop_o1(F.relu(self._fc_o1(torch.flatten(self._conv_o1(out1), 1)))))
            out2 = self._out2(self._drop_o2(self._fc_o2(torch.flatten(self._conv_o2(out2), 1))))  # no ReLU: Paddle's
        return out, out1, out2


def googlenet(pretrained: bool = False, **kwargs: Any) -> GoogLeNet:
    """GoogLeNet: ``GoogLeNet(**kwargs)``; its forward returns ``(out, out1, out2)``."""
    refuse_pretrained("googlenet", pretrained)
    return GoogLeNet(**kwargs)
