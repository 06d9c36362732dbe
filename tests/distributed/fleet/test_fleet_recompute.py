"""recompute: named submodules checkpointed (non-reentrant); gradients and BN statistics equal a plain run."""

import copy

import pytest
import torch
import torch.nn.functional as F
from fleet_models import Net, batch, fresh_fleet, max_diff, params_of
from parity import max_abs_diff, worst

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import DistributedStrategy
from fleetlite.distributed.fleet.recompute import apply_recompute, is_recomputed, recompute, remove_recompute
from fleetlite.testing import run_ranks


def _recompute(rank, world):
    fresh_fleet(DistributedStrategy(recompute=True, recompute_configs={"checkpoints": ["block1", "block2.fc"]}))
    torch.manual_seed(0)
    net = Net(dropout=0.3)  # dropout: the recompute must replay the same masks
    ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net))  # the peer: torch DDP
    model = fleet.distributed_model(net)
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    grad_diff = []
    for step in range(3):
        x, y = batch(step, rank)
        for m in (model, ref):
            torch.manual_seed(100 + step)
            F.cross_entropy(m(x), y).backward()
        grad_diff.append(max_abs_diff([p.grad for p in model.parameters()], [q.grad for q in ref.parameters()]))
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    for m in (model, ref):
        torch.manual_seed(9)
        with torch.no_grad():  # no recompute without grad
            m(batch(9, rank)[0])
    return (worst(grad_diff), max_diff(params_of(model), params_of(ref.module)), net.block1.calls,
            ref.module.block1.calls, net.block2.calls, list(model.state_dict()) == list(ref.module.state_dict()))


@pytest.mark.timeout(120)
def test_recompute_equals_plain_training():
    for grad_diff, diff, calls, ref_calls, block2_calls, same_keys in run_ranks(_recompute):
        assert grad_diff <= 1e-6 and diff <= 1e-6  # BN running stats included (Note [recompute buffers])
        assert (calls, ref_calls) == (7, 4)  # recomputed in each backward, not under no_grad
        assert block2_calls == 4  # only block2.fc is recomputed, not block2 itself
        assert same_keys


def test_unknown_or_missing_checkpoints_are_refused_before_any_change(single):
    single(recompute=True, recompute_configs={"checkpoints": ["block1", "blok2"]})
    net = Net()
    with pytest.raises(KeyError, match=r"'blok2'.*Did you mean 'block2'"):
        fleet.distributed_model(net)
    assert not is_recomputed(net.block1)
    single(recompute=True)
    with pytest.raises(ValueError, match=r"checkpoints'\] is empty.*'stem', 'block1'"):
        fleet.distributed_model(Net())


def test_recompute_function_and_undo():
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    x = torch.randn(6, 4, requires_grad=True)
    recompute(lin, x).sum().backward()
    g1, stats1 = x.grad.clone(), lin[1].running_mean.clone()
    lin[1].reset_running_stats()
    x.grad = None
    lin(x).sum().backward()
    torch.testing.assert_close(x.grad, g1)
    torch.testing.assert_close(lin[1].running_mean, stats1)  # updated once, not twice
    apply_recompute(lin, ["0"])
    assert is_recomputed(lin[0]) and "forward" in vars(lin[0])
    remove_recompute(lin)
    assert not is_recomputed(lin[0]) and "forward" not in vars(lin[0])
