"""Paddle's ``LeNet`` (``paddle.vision.models.LeNet``): for 1x28x28 images such as MNIST."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LeNet"]


class LeNet(nn.Module):
    """LeNet as Paddle builds it: two conv + ReLU + max-pool stages and three linear layers (no activations).

    Args:
        num_classes: outputs of the last linear layer; ``<= 0`` leaves out the
            linear layers and returns the ``(N, 16, 5, 5)`` features. Default 10.

    Parameter names follow Paddle's (``features.0``, ``features.3``,
    ``fc.0``, ``fc.1``, ``fc.2``), so a Paddle LeNet's weights map one to one
    (Paddle stores linear weights as ``(in, out)``: transpose them).

    Example::

        net = LeNet()
        assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 3, stride=1, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Conv2d(6, 16, 5, stride=1, padding=0), nn.ReLU(), nn.MaxPool2d(2, 2))
        if num_classes > 0:
            self.fc = nn.Sequential(nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, num_classes))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.features(inputs)
        if self.num_classes > 0:
            x = self.fc(torch.flatten(x, 1))
        return x
