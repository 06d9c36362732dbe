"""clear_gradients() on the model fleet.distributed_model returns, as Paddle's Layer.clear_gradients: gradients
zeroed in place (set_to_zero=True, the default) or dropped (False); the next step trains as after zero_grad."""

import warnings

import pytest
import torch

from fleetlite.distributed import fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.testing import run_ranks


def _step(model):
    model(torch.randn(4, 8)).square().mean().backward()


def _check(model):
    """What Paddle documents, checked against zero_grad on a plain copy."""
    _step(model)
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())
    model.clear_gradients()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    _step(model)
    model.clear_gradients(set_to_zero=False)
    assert all(p.grad is None for p in model.parameters())
    torch.manual_seed(1)
    x = torch.randn(4, 8)
    model(x).square().mean().backward()  # after clearing, the next backward gives fresh (not accumulated) grads
    return [p.grad.clone() for p in model.parameters()], x


def test_clear_gradients_single_process(clean_dist_env):
    fleet_impl._reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fleet.init(is_collective=True)
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    reference = [p.detach().clone() for p in plain.parameters()]
    model = fleet.distributed_model(plain)
    grads, x = _check(model)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    with torch.no_grad():
        for p, r in zip(ref.parameters(), reference):
            p.copy_(r)
    ref(x).square().mean().backward()
    assert all(torch.allclose(g, p.grad) for g, p in zip(grads, ref.parameters()))
    fleet_impl._reset()


def _on_ranks(rank, world_size, stage):
    strategy = fleet.DistributedStrategy()
    if stage:
        strategy.sharding = True
        strategy.sharding_configs = {"stage": stage}
    fleet.init(is_collective=True, strategy=strategy)
    torch.manual_seed(0)
    model = fleet.distributed_model(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(),
                                                        torch.nn.Linear(4, 2)))
    _step(model)
    model.clear_gradients()
    zeroed = all(p.grad is not None and not p.grad.any() for p in model.parameters())
    _step(model)
    model.clear_gradients(set_to_zero=False)
    dropped = all(p.grad is None for p in model.parameters())
    return type(model).__name__, zeroed, dropped


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stage", [0, 2])
def test_clear_gradients_on_two_ranks(stage):
    for name, zeroed, dropped in run_ranks(_on_ranks, world_size=2, args=(stage,), timeout=150):
        assert name == ("ShardedDataParallel" if stage else "DataParallel")
        assert zeroed and dropped
