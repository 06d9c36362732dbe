"""Small models, data and rank functions shared by the Trainer tests (module level: run_ranks pickles by name)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import fleetlite


def mlp(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 3))


def xy(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return x, y


def dataset(n: int, seed: int = 1) -> TensorDataset:
    return TensorDataset(*xy(n, seed))


class NoisyDataset(Dataset):
    """Samples with per-access random noise from the global torch RNG (exercises RNG restore on resume)."""

    def __init__(self, n: int, seed: int = 1):
        self.x, self.y = xy(n, seed)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i] + 0.01 * torch.randn(6), self.y[i]


class IndexedDataset(Dataset):
    """(features, label, index): lets a custom train_step record which samples it saw."""

    def __init__(self, n: int, seed: int = 1):
        self.x, self.y = xy(n, seed)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class RecordingTrainer(fleetlite.Trainer):
    """Keras' custom-step pattern: records the sample indices of each training batch."""

    seen: list[int]

    def train_step(self, batch):
        x, y, idx = batch
        self.__dict__.setdefault("seen", []).extend(idx.tolist())
        out = self.parallel_network(x)
        loss = self.loss_fn(out, y)
        self.backward(loss)
        self.optimizer_step()
        self.update_metrics(out, (y,))
        return {"loss": loss}


def trainer(seed: int = 0, dropout: float = 0.0, lr: float = 0.05, metrics=True, cls=fleetlite.Trainer, **kw):
    net = mlp(seed, dropout)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    ms = [fleetlite.metric.Accuracy(topk=(1, 2))] if metrics else None
    return cls(net, opt, nn.CrossEntropyLoss(), metrics=ms, device="cpu", **kw)


def params(t) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.network.state_dict().items()}
