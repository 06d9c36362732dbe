"""distributed_optimizer: gradient merge and sharding stage 1 against plain data parallel; the optimizer API."""

import copy

import pytest
import torch
import torch.nn.functional as F
from fleet_models import MLP, batch, fresh_fleet, max_diff, params_of
from parity import worst

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import DistributedOptimizer, DistributedStrategy
from fleetlite.testing import run_ranks

K, B = 4, 2


def _merge(rank, world, avg, opt_first):
    fresh_fleet(DistributedStrategy(gradient_merge=True, gradient_merge_configs={"k_steps": K, "avg": avg}))
    torch.manual_seed(0)
    net = MLP()
    ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net))  # the peer: torch DDP
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    if opt_first:  # the optimizer may be wrapped before the model: the model is attached when it appears
        opt = fleet.distributed_optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
        model = fleet.distributed_model(net)
    else:
        model = fleet.distributed_model(net)
        opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    syncs, stepped = [], []
    for step in range(2):
        xs, ys = zip(*(batch(K * step + i, rank, n=B) for i in range(K)))
        for x, y in zip(xs, ys):
            syncs.append(model.require_backward_grad_sync)
            if opt_first:  # Paddle's minimize, zero_grad first (a Trainer-style loop)
                opt.zero_grad()
                opt.minimize(F.cross_entropy(model(x), y))
            else:  # the quick-start loop
                F.cross_entropy(model(x), y).backward()
                opt.step()
                opt.clear_grad()
            stepped.append(opt.stepped)
        # reference: one step on the K micro-batches at once (batch K*B); the merged sum is K times the mean
        loss = F.cross_entropy(ref(torch.cat(xs)), torch.cat(ys)) * (1 if avg else K)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return max_diff(params_of(model), params_of(ref.module)), syncs, stepped


@pytest.mark.timeout(120)
@pytest.mark.parametrize("avg, opt_first", [(True, False), (False, True)])
def test_gradient_merge_equals_one_step_on_k_times_the_batch(avg, opt_first):
    for diff, syncs, stepped in run_ranks(_merge, args=(avg, opt_first)):
        assert diff <= 1e-6
        assert syncs == [False, False, False, True] * 2  # only the k-th backward all-reduces
        assert stepped == [False, False, False, True] * 2


def _state_numel(state):
    return sum(t.numel() for s in state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)


def _sharding(rank, world):
    fresh_fleet(DistributedStrategy(sharding=True, sharding_configs={"stage": 1}))
    torch.manual_seed(0)
    net = MLP(width=16, depth=6)
    ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net))  # the peer: torch DDP
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    model = fleet.distributed_model(net)
    opt = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # a DistributedOptimizer is an Optimizer
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    for step in range(3):
        x, y = batch(step, rank)
        for m, o, s in ((model, opt, sched), (ref, ref_opt, ref_sched)):
            F.cross_entropy(m(x), y).backward()
            o.step()
            o.zero_grad()
            s.step()
    full_state = opt.state_dict()  # collective; the full state on rank 0 only
    state_diff = 0.0
    if rank == 0:
        plain = torch.optim.Adam(copy.deepcopy(ref.module).parameters(), lr=1.0)
        plain.load_state_dict(full_state)
        state_diff = worst(max_diff(plain.state_dict()["state"][i], ref_opt.state_dict()["state"][i])
                           for i in ref_opt.state_dict()["state"])
    else:
        assert "state" not in full_state and full_state["fleet_state_on_rank0"]
    # rank 0's full state reaches the others at load; ZeroRedundancyOptimizer re-partitions it, training goes on
    opt.set_state_dict(full_state)
    x, y = batch(7, rank)
    for m, o in ((model, opt), (ref, ref_opt)):
        F.cross_entropy(m(x), y).backward()
        o.step()
        o.zero_grad()
    largest = max(p.numel() for p in net.parameters()) * 2  # exp_avg + exp_avg_sq of the biggest parameter
    return (max_diff(params_of(model), params_of(ref.module)), _state_numel(opt.state), _state_numel(ref_opt.state),
            largest, state_diff, opt.get_lr(), ref_opt.param_groups[0]["lr"], type(opt.inner_opt).__name__)


@pytest.mark.timeout(120)
def test_sharding_stage1_equals_plain_data_parallel_with_partitioned_state():
    results = run_ranks(_sharding)
    locals_ = [r[1] for r in results]
    for diff, local, full, largest, state_diff, lr, ref_lr, inner in results:
        assert inner == "ZeroRedundancyOptimizer"
        assert diff <= 1e-6 and state_diff <= 1e-6
        assert abs(local - full / 2) <= largest  # about 1/world of the state on each rank
        assert lr == ref_lr == 1e-2 * 0.5 ** 3
    assert sum(locals_) == results[0][2]  # the shards cover the full state exactly once


_OPTIMIZERS = {
    "SGD": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "Adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-3),
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=1e-2),  # its defaults hold a key its constructor rejects
    "RMSprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.5),
    "Adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2),  # has state before its first step
}


def _stage1_vs_ddp(rank, world, names):
    out = {}
    for name in names:
        fresh_fleet(DistributedStrategy(sharding=True, sharding_configs={"stage": 1}))
        torch.manual_seed(0)
        net = MLP(width=16, depth=3)
        ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net))
        ref_opt = _OPTIMIZERS[name](ref.parameters())
        model = fleet.distributed_model(net)
        opt = fleet.distributed_optimizer(_OPTIMIZERS[name](model.parameters()))
        for step in range(5):
            x, y = batch(step, rank)
            for m, o in ((model, opt), (ref, ref_opt)):
                F.cross_entropy(m(x), y).backward()
                o.step()
                o.zero_grad()
        out[name] = (max_diff(params_of(model), params_of(ref.module)), type(opt.inner_opt.optim).__name__)
    return out


@pytest.mark.timeout(180)
def test_sharding_stage1_rebuilds_every_torch_optimizer_and_matches_ddp():
    for result in run_ranks(_stage1_vs_ddp, args=(list(_OPTIMIZERS),), timeout=170):
        for name, (diff, inner) in result.items():
            assert inner == name
            assert diff <= 1e-6, name


# --- single process: the optimizer API -------------------------------------------------------------------------


def test_optimizer_api(single):
    single()
    lin = torch.nn.Linear(3, 1)
    opt = fleet.distributed_optimizer(torch.optim.SGD(lin.parameters(), lr=0.5))
    assert isinstance(opt, DistributedOptimizer) and isinstance(opt, torch.optim.Optimizer)
    assert opt.inner_opt is opt.user_opt and opt.param_groups is opt.inner_opt.param_groups
    assert opt.get_lr() == 0.5
    opt.set_lr(0.25)
    assert opt.inner_opt.param_groups[0]["lr"] == 0.25
    with pytest.raises(ValueError, match="set_lr"):
        opt.set_lr(-1)
    lin(torch.ones(2, 3)).sum().backward()
    before = lin.weight.detach().clone()
    expected = before - 0.25 * lin.weight.grad
    opt.step()
    torch.testing.assert_close(lin.weight.detach(), expected)
    opt.clear_grad()
    assert torch.count_nonzero(lin.weight.grad) == 0  # Paddle's clear_grad zeroes
    opt.clear_grad(set_to_zero=False)
    assert lin.weight.grad is None
    with pytest.raises(NotImplementedError, match="static-graph"):
        opt.minimize(lin(torch.ones(1, 3)).sum(), parameters=[lin.weight])
    with pytest.raises(TypeError, match="already a DistributedOptimizer"):
        fleet.distributed_optimizer(opt)


def test_state_dict_round_trip_loads_into_plain_optimizer(single):
    single(gradient_merge=True, gradient_merge_configs={"k_steps": 2})
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    opt = fleet.distributed_optimizer(torch.optim.Adam(lin.parameters(), lr=0.1))
    for _ in range(2):
        opt.minimize(lin(torch.randn(4, 3)).square().mean())
    sd = opt.state_dict()
    plain = torch.optim.Adam(lin.parameters(), lr=0.1)
    plain.load_state_dict(sd)
    torch.testing.assert_close(plain.state_dict()["state"], opt.inner_opt.state_dict()["state"])
    opt.set_state_dict(plain.state_dict())
    torch.testing.assert_close(opt.state_dict()["state"], sd["state"])


def test_grads_are_kept_inside_a_merge_window(single):
    single(gradient_merge=True, gradient_merge_configs={"k_steps": 3})
    lin = torch.nn.Linear(2, 1, bias=False)
    opt = fleet.distributed_optimizer(torch.optim.SGD(lin.parameters(), lr=1.0))
    w0 = lin.weight.detach().clone()
    for i in range(3):
        lin(torch.ones(1, 2) * (i + 1)).sum().backward()
        opt.step()
        opt.clear_grad()
        if i < 2:
            torch.testing.assert_close(lin.weight.grad, torch.full((1, 2), float(sum(range(1, i + 2)))))
    torch.testing.assert_close(lin.weight.detach(), w0 - (1 + 2 + 3) / 3)  # averaged over k
    assert torch.count_nonzero(lin.weight.grad) == 0


def test_strategy_given_to_distributed_optimizer_overrides_with_warning(single):
    single()
    lin = torch.nn.Linear(2, 1)
    model = fleet.distributed_model(lin)  # noqa: F841 (kept alive: the facade holds models weakly)
    with pytest.warns(UserWarning, match=r"overrides the one given to fleet.init.*model-side fields \['amp'"):
        opt = fleet.distributed_optimizer(torch.optim.SGD(lin.parameters(), lr=0.1), DistributedStrategy(amp=True))
    assert fleet.get_strategy().amp and opt.amp.enabled


def test_step_hooks_fire_on_real_steps_only_under_gradient_merge():
    strategy = DistributedStrategy(gradient_merge=True, gradient_merge_configs={"k_steps": 2})
    fresh_fleet(strategy)
    model = torch.nn.Linear(2, 1)
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    pre, post = [], []
    h = opt.register_step_pre_hook(lambda o, a, k: pre.append(o))
    opt.register_step_post_hook(lambda o, a, k: post.append(o))
    for _ in range(4):
        opt.minimize(model(torch.randn(3, 2)).sum())
        opt.clear_grad()
    assert len(pre) == len(post) == 2 and pre[0] is opt.inner_opt
    h.remove()
    opt.minimize(model(torch.randn(3, 2)).sum())
    opt.minimize(model(torch.randn(3, 2)).sum())
    assert len(pre) == 2 and len(post) == 3
