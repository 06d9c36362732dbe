"""Small models shared by the engine tests and benchmarks."""

import torch
from torch import nn


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean((2, 3)))


class DeepMLP(nn.Module):
    """Over 100 parameter tensors."""

    def __init__(self, depth=55, width=16):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.mid = nn.Linear(8, 8)
        self.out = nn.Linear(8, 20, bias=False)
        self.out.weight = self.emb.weight  # tied

    def forward(self, idx):
        h = self.mid(self.emb(idx))
        h = self.mid(torch.relu(h))  # used twice in one forward
        return self.out(h)


class Branchy(nn.Module):
    """`unused` is never used; `odd` is used only when the batch says so (differs across ranks)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.odd = nn.Linear(6, 6)
        self.unused = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x, use_odd: bool):
        h = torch.relu(self.a(x))
        if use_odd:
            h = h + self.odd(h)
        return self.head(h)
