"""Every Trainer built without ``strategy=`` takes the strategy the user gave ``fleet.init`` (Note [trainer
strategy]), not only the first one: a Trainer's own ``fleet.init`` must not make the next Trainer fall back
to the default strategy (no gradient merge; a tensor-parallel model evaluated as plain data parallel).

References: a hand-written gradient-merge loop (one process), and the one-process model the tensor-parallel
slices come from (two ranks)."""

from __future__ import annotations

import torch
import torch.distributed as td
from torch import nn
from torch.utils.data import TensorDataset

import fleetlite
from fleetlite.distributed import fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import ColumnParallelLinear, RowParallelLinear, is_split
from fleetlite.testing import run_ranks

K = 2  # gradient merge window


def _data(n: int = 16, seed: int = 3) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, (x[:, :1] * 2 - x[:, 1:2]).detach())


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _hand_loop_with_gradient_merge(data: TensorDataset, batch: int) -> dict[str, torch.Tensor]:
    """Plain torch: gradients of K batches averaged, then one SGD step (Paddle's gradient merge, avg=True)."""
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss_fn = nn.MSELoss()
    x, y = data.tensors
    for i, start in enumerate(range(0, len(x), batch)):
        (loss_fn(net(x[start:start + batch]), y[start:start + batch]) / K).backward()
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _fit(data: TensorDataset, batch: int, **trainer_kw) -> dict[str, torch.Tensor]:
    net = _net()
    t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), nn.MSELoss(), device="cpu", **trainer_kw)
    t.fit(data, epochs=1, batch_size=batch, shuffle=False, verbose=0)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def test_every_trainer_without_a_strategy_takes_the_users_fleet_init_strategy(clean_dist_env):
    fleet_impl._reset()
    data, batch = _data(), 4
    expected = _hand_loop_with_gradient_merge(data, batch)
    strategy = fleet.DistributedStrategy()
    strategy.gradient_merge = True
    strategy.gradient_merge_configs = {"k_steps": K, "avg": True}
    fleet.init(is_collective=True, strategy=strategy)
    try:
        first = _fit(data, batch)
        second = _fit(data, batch)  # before the fix: the default strategy, a step every batch
        _fit(data, batch, strategy=fleet.DistributedStrategy())  # a Trainer's own strategy...
        third = _fit(data, batch)  # ...does not replace the user's
        for got in (first, second, third):
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    finally:
        fleet_impl._reset()


# ---------------------------------------------------------------- two ranks: a tensor-parallel model

def _tp_reference() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


class _TPNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.col = ColumnParallelLinear(4, 8, has_bias=True, gather_output=False)
        self.row = RowParallelLinear(8, 1, input_is_parallel=True)

    def forward(self, x):
        return self.row(torch.tanh(self.col(x)))


def _tp_net(rank: int) -> _TPNet:
    """This rank's slices of the reference's weights (split along each parameter's ``split_axis``)."""
    ref = dict(zip(("col.weight", "col.bias", "row.weight", "row.bias"), _tp_reference().parameters()))
    net = _TPNet()
    with torch.no_grad():
        for name, p in net.named_parameters():
            full = ref[name]
            p.copy_(full.chunk(2, dim=p.split_axis)[rank] if is_split(p) else full)
    return net


def _evaluate_twice_on_mp2(rank: int, world: int) -> list[float]:
    torch.set_num_threads(1)
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    model = fleet.distributed_model(_tp_net(td.get_rank()))
    losses = []
    for _ in range(2):  # before the fix the second Trainer re-initialised fleet as plain data parallel
        t = fleetlite.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), device="cpu")
        losses.append(t.evaluate(_data(), batch_size=4, verbose=0)["loss"])
    return losses


def test_a_second_trainer_keeps_the_users_tensor_parallel_strategy():
    ref = _tp_reference()
    x, y = _data().tensors
    with torch.no_grad():
        expected = nn.MSELoss()(ref(x), y).item()
    for rank, losses in enumerate(run_ranks(_evaluate_twice_on_mp2, world_size=2)):
        assert len(losses) == 2, rank
        for loss in losses:
            torch.testing.assert_close(torch.tensor(loss), torch.tensor(expected), rtol=1e-5, atol=1e-6,
                                       msg=f"rank {rank}: {losses} vs one process {expected}")
