"""Models, data and references shared by the sharding tests (module name unique across tests/)."""

import copy

import torch
import torch.nn.functional as F
from parity import max_abs_diff
from torch import nn

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import DistributedStrategy
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.trainer import callbacks as C


class MLP(nn.Module):
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


def max_diff(a, b):
    """The largest difference between two state dicts with the same keys; NaN if either holds a NaN."""
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max_abs_diff(a, b)


def sharded(stage, **fields):
    """A strategy with sharding at ``stage`` (configs merged from ``sharding_configs``)."""
    cfg = {"stage": stage, **fields.pop("sharding_configs", {})}
    return DistributedStrategy(sharding=True, sharding_configs=cfg, **fields)


def train_pair(rank, strategy, steps=10, k=1, amp_dtype=None, opt_first=False, clip=None, lr=1e-2, dtypes=None):
    """Train fleet(strategy) and torch DDP (+autocast) from the same init and data with AdamW.

    ``dtypes``: a set that collects the dtype of the fleet model's head output (which autocast dtype really ran).
    Returns (fleet model, DDP model, fleet optimizer, DDP optimizer, clip norms).
    """
    fleet_impl._reset()
    fleet.init(is_collective=True, strategy=strategy)
    torch.manual_seed(0)
    net = MLP()
    ref = nn.parallel.DistributedDataParallel(copy.deepcopy(net))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr)
    if dtypes is not None:
        net.head.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
    if opt_first:  # the optimizer over the original parameters: rebuilt over the shards
        opt = fleet.distributed_optimizer(torch.optim.AdamW(net.parameters(), lr=lr))
        model = fleet.distributed_model(net)
    else:
        model = fleet.distributed_model(net)
        opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=lr))
    norms = []
    for step in range(steps):
        micro = [batch(k * step + i, rank) for i in range(k)]
        for i, (x, y) in enumerate(micro):
            F.cross_entropy(model(x), y).backward()
            if i == k - 1 and clip is not None:
                norms.append(float(model.clip_grad_norm_(clip)))
            opt.step()
            opt.clear_grad()
        for i, (x, y) in enumerate(micro):
            ctx = ref.no_sync() if i < k - 1 else torch.enable_grad()
            with ctx:
                if amp_dtype is not None:
                    with torch.autocast("cpu", dtype=amp_dtype):
                        out = ref(x)
                    loss = F.cross_entropy(out.float(), y)
                else:
                    loss = F.cross_entropy(ref(x), y)
                (loss / k).backward()
        if clip is not None:
            norms.append(float(nn.utils.clip_grad_norm_(ref.parameters(), clip)))
        ref_opt.step()
        ref_opt.zero_grad()
    return model, ref, opt, ref_opt, norms


class IndexedDataset(torch.utils.data.Dataset):
    """(features, label, index): a custom train_step can record which samples it saw."""

    def __init__(self, n, seed=1):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0.5).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class StopAt(C.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, step, logs=None):
        if self.trainer.global_step == self.step and self.trainer.at_step_boundary:
            self.trainer.stop_training = True
