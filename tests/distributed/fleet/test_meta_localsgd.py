"""strategy.localsgd / adaptive_localsgd on 2 gloo ranks, against a hand-written local SGD run of both ranks."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from fleet_models import MLP, batch, fresh_fleet

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import DistributedStrategy
from fleetlite.distributed.fleet.meta_optimizers import LocalSGDOptimizer
from fleetlite.testing import run_ranks

STEPS, WORLD, LR = 12, 2, 0.2


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _ranks(rank, world, strategy, adaptive):
    fresh_fleet(DistributedStrategy.from_dict(strategy))
    torch.manual_seed(0)
    model = fleet.distributed_model(MLP())
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9))
    assert isinstance(opt.inner_opt, LocalSGDOptimizer)
    flats, losses = [], []
    for step in range(1, STEPS + 1):
        x, y = batch(step, rank)
        opt.clear_grad()
        loss = F.cross_entropy(model(x), y)
        losses.append(loss.item())
        if adaptive:
            opt.minimize(loss)
        else:
            loss.backward()
            opt.step()
        flats.append(_flat(model))
    # a checkpoint resumes the schedule: the averager's step (and adaptive interval) and the hook's step count
    saved = opt.state_dict()
    fresh_fleet(DistributedStrategy.from_dict(strategy))
    opt2 = fleet.distributed_optimizer(torch.optim.SGD(fleet.distributed_model(MLP()).parameters(), lr=LR,
                                                       momentum=0.9))
    opt2.load_state_dict(saved)
    a, b = opt.inner_opt, opt2.inner_opt
    assert b.averager.step == a.averager.step == STEPS and b.hook_state.iter == a.hook_state.iter
    if adaptive:
        assert b.averager.state_dict() == a.averager.state_dict()
    opt2.set_lr(0.01)
    assert opt2.inner_opt.optim.param_groups[0]["lr"] == 0.01
    return flats, losses


def _reference(begin, k_rule):
    """Both ranks by hand: data parallel (gradients averaged) for steps 1..begin, then local steps and a
    parameter average (a / 2 + b / 2, as torch's average_parameters) whenever ``k_rule`` says so."""
    torch.manual_seed(0)
    net = MLP()
    models = [copy.deepcopy(net) for _ in range(WORLD)]
    opts = [torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9) for m in models]
    flats, averaged, last = [], [], begin
    loss0 = None
    for step in range(1, STEPS + 1):
        losses = []
        for r, m in enumerate(models):
            x, y = batch(step, r)
            m.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            losses.append(loss.detach())
        mean_loss = float(sum(lo / WORLD for lo in losses))
        loss0 = mean_loss if step == 1 else loss0
        if step <= begin:
            for ps in zip(*(m.parameters() for m in models)):
                g = sum(p.grad / WORLD for p in ps)
                for p in ps:
                    p.grad = g.clone()
        for o in opts:
            o.step()
        if step > begin and k_rule.due(step, last):
            with torch.no_grad():
                for ps in zip(*(m.parameters() for m in models)):
                    avg = sum(p / WORLD for p in ps)
                    for p in ps:
                        p.copy_(avg)
            averaged.append(step)
        if step >= begin and (step == begin or step in averaged):
            k_rule.update(mean_loss, loss0)
            last = step
        flats.append([_flat(m) for m in models])
    return flats, averaged


class _Fixed:
    def __init__(self, k):
        self.k = k

    def due(self, step, last):
        return step - last == self.k

    def update(self, loss, loss0):
        pass


class _Adaptive(_Fixed):
    """Paddle's AdaptiveLocalSGDOptimizer rule with a constant learning rate (lr_0 / lr = 1)."""

    def __init__(self, init_k):
        super().__init__(init_k)
        self.init_k = init_k

    def update(self, loss, loss0):
        self.k = min(max(math.ceil(math.sqrt(loss / loss0 * self.init_k)), 1), 16)


def _check(out, ref_flats, averaged, begin):
    (flats0, _), (flats1, _) = out
    for step in range(1, STEPS + 1):
        a, b = flats0[step - 1], flats1[step - 1]
        ref_a, ref_b = ref_flats[step - 1]
        # finite first, so a NaN fails here by name (assert_close, torch.equal and the drift bound below all
        # fail on NaN too, but only as a mismatch)
        assert torch.isfinite(a).all() and torch.isfinite(b).all(), f"step {step}: non-finite weights"
        torch.testing.assert_close(a, ref_a, rtol=0, atol=2e-6)
        torch.testing.assert_close(b, ref_b, rtol=0, atol=2e-6)
        if step <= begin or step in averaged:
            assert torch.equal(a, b), step  # data parallel, or just averaged: the same on every rank
        else:
            assert (a - b).abs().max() > 1e-4, step  # local steps: the ranks drift apart


@pytest.mark.timeout(300)
def test_localsgd_equals_local_steps_plus_an_average_every_k():
    begin, k = 3, 3
    strategy = {"localsgd": True, "localsgd_configs": {"k_steps": k, "begin_step": begin}}
    out = run_ranks(_ranks, args=(strategy, False))
    ref_flats, averaged = _reference(begin, _Fixed(k))
    assert averaged == [6, 9, 12]
    _check(out, ref_flats, averaged, begin)


@pytest.mark.timeout(300)
def test_adaptive_localsgd_follows_paddles_interval_rule():
    begin, init_k = 2, 6
    strategy = {"adaptive_localsgd": True, "adaptive_localsgd_configs": {"init_k_steps": init_k, "begin_step": begin}}
    out = run_ranks(_ranks, args=(strategy, True))
    ref_flats, averaged = _reference(begin, _Adaptive(init_k))
    # the rule set k from the loss at begin_step (here 3, not init_k_steps): the ranks must follow that schedule
    assert len(averaged) >= 2 and averaged[0] - begin != init_k
    _check(out, ref_flats, averaged, begin)


def test_localsgd_not_applied_with_one_rank_or_adam(single):
    single(localsgd=True)
    model = fleet.distributed_model(MLP())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="one rank"):
        opt = fleet.distributed_optimizer(sgd)
    assert opt.inner_opt is sgd
