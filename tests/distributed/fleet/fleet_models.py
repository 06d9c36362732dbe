"""Small models and data shared by the fleet tests (module name unique across tests/)."""

import torch
from parity import max_abs_diff
from torch import nn

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl


class Block(nn.Module):
    """Linear + BatchNorm + dropout; counts its forward runs (recompute runs it twice)."""

    def __init__(self, width, dropout=0.0):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.bn = nn.BatchNorm1d(width)
        self.drop = nn.Dropout(dropout)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.drop(torch.relu(self.bn(self.fc(x))))


class Net(nn.Module):
    def __init__(self, width=16, dropout=0.0, out=3):
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.block1 = Block(width, dropout)
        self.block2 = Block(width, dropout)
        self.head = nn.Linear(width, out)

    def forward(self, x):
        return self.head(self.block2(self.block1(self.stem(x))))


class MLP(nn.Module):
    """No batch statistics: a merged batch equals one big batch exactly."""

    def __init__(self, width=16, depth=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8 if i == 0 else width, width) for i in range(depth))
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def batch(step, rank, n=4, seed=0):
    g = torch.Generator().manual_seed(seed + 1000 * step + rank)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def fresh_fleet(strategy=None):
    """Start from a clean facade state (each test function may init again)."""
    fleet_impl._reset()
    fleet.init(is_collective=True, strategy=strategy)


def params_of(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a, b):
    """The largest difference over the keys of ``a``; NaN if either side holds a NaN."""
    return max_abs_diff(a, b)
