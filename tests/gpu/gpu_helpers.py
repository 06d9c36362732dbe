"""Rank functions and models for the GPU suite (module level, so spawned ranks can import them)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpus(n: int):
    """Skip unless ``n`` CUDA devices are visible."""
    return pytest.mark.skipif(gpu_count() < n, reason=f"needs {n} CUDA device(s), {gpu_count()} visible")


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def batch(step: int, rank: int, device, n: int = 16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 3, 8, 8, generator=g).to(device), torch.randint(0, 10, (n,), generator=g).to(device)


def dp_vs_ddp(rank, world, steps=5):
    """Train the same net with fleetlite's DataParallel and torch's DDP on this rank's CUDA device."""
    import fleetlite
    from fleetlite.distributed import ParallelEnv

    device = ParallelEnv().device
    out = {}
    for kind in ("fleetlite", "ddp"):
        torch.manual_seed(0)
        net = SmallNet().to(device)
        model = fleetlite.DataParallel(net) if kind == "fleetlite" else \
            nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(steps):
            x, y = batch(step, rank, device)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        out[kind] = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    return out


def device_report(rank, world):
    import torch.distributed as tdist

    from fleetlite.distributed import ParallelEnv

    return {"config": str(tdist.get_backend_config()), "device": str(ParallelEnv().device),
            "current": torch.cuda.current_device(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
