"""strategy.lamb / strategy.lars applied in eager mode, checked against hand-written steps of Paddle's formulas."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from fleet_models import MLP, batch

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet.meta_optimizers import Lamb, LarsMomentum

STEPS = 5


def _grads(model, step):
    x, y = batch(step, 0)
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _lamb_reference(net, lr, betas, eps, wd, exclude):
    """Paddle's lamb kernel written out: bias-corrected moments, decay added to r, trust ratio ||w|| / ||r|| (none
    without decay: Lamb's always_adapt=False)."""
    model = copy.deepcopy(net)
    b1, b2 = betas
    m = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    v = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for t in range(1, STEPS + 1):
        grads = _grads(model, t)
        with torch.no_grad():
            for n, p in model.named_parameters():
                g = grads[n]
                m[n] = b1 * m[n] + (1 - b1) * g
                v[n] = b2 * v[n] + (1 - b2) * g * g
                r = (m[n] / (1 - b1 ** t)) / (torch.sqrt(v[n] / (1 - b2 ** t)) + eps)
                decay = 0.0 if any(n.endswith(e) for e in exclude) else wd
                r = r + decay * p
                pn, rn = p.norm().item(), r.norm().item()
                ratio = pn / rn if pn > 0 and rn > 0 and decay > 0 else 1.0
                p -= lr * ratio * r
    return model


def _lars_reference(net, lr, mu, coeff, wd, eps, exclude):
    """Paddle's lars_momentum kernel written out: layer-wise local lr, lr inside the velocity."""
    model = copy.deepcopy(net)
    vel = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for t in range(1, STEPS + 1):
        grads = _grads(model, t)
        with torch.no_grad():
            for n, p in model.named_parameters():
                g = grads[n]
                decay = 0.0 if any(e in n for e in exclude) else wd
                pn, gn = p.norm().item(), g.norm().item()
                local = lr * coeff * pn / (gn + decay * pn + eps) if decay > 0 and pn > 0 and gn > 0 else lr
                vel[n] = mu * vel[n] + local * (g + decay * p)
                p -= vel[n]
    return model


def _train(model, opt):
    for t in range(1, STEPS + 1):
        x, y = batch(t, 0)
        opt.clear_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def _assert_same(model, ref):
    for (n, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("adam", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("exclude", [[], ["bias"]])
def test_lamb_equals_paddle_formula(single, adam, exclude):
    single(lamb=True, lamb_configs={"lamb_weight_decay": 0.05, "exclude_from_weight_decay": exclude})
    torch.manual_seed(0)
    net = MLP()
    ref = _lamb_reference(net, lr=0.01, betas=(0.8, 0.95), eps=1e-6, wd=0.05, exclude=exclude)
    model = fleet.distributed_model(net)
    opt = fleet.distributed_optimizer(adam(model.parameters(), lr=0.01, betas=(0.8, 0.95), eps=1e-6))
    assert isinstance(opt.inner_opt, Lamb)
    _train(model, opt)
    _assert_same(model, ref)


def test_lamb_learning_rate_follows_a_scheduler_on_the_user_optimizer(single):
    single(lamb=True)
    model = fleet.distributed_model(MLP())
    adam = torch.optim.Adam(model.parameters(), lr=0.1)
    opt = fleet.distributed_optimizer(adam)
    sched = torch.optim.lr_scheduler.StepLR(adam, step_size=1, gamma=0.5)
    _train(model, opt)
    sched.step()
    assert opt.inner_opt.param_groups[0]["lr"] == pytest.approx(0.05)
    assert math.isfinite(float(opt.inner_opt.state[next(model.parameters())]["step"]))


@pytest.mark.parametrize("exclude", [[], ["bias"]])
def test_lars_equals_paddle_formula(single, exclude):
    cfg = {"lars_coeff": 0.01, "lars_weight_decay": 0.001, "epsilon": 1e-8, "exclude_from_weight_decay": exclude}
    single(lars=True, lars_configs=cfg)
    torch.manual_seed(0)
    net = MLP()
    ref = _lars_reference(net, lr=0.5, mu=0.9, coeff=0.01, wd=0.001, eps=1e-8, exclude=exclude)
    model = fleet.distributed_model(net)
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9))
    assert isinstance(opt.inner_opt, LarsMomentum)
    _train(model, opt)
    _assert_same(model, ref)


def test_lamb_and_lars_are_not_applied_to_other_optimizers(single):
    single(lamb=True, lars=False)
    model = fleet.distributed_model(MLP())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.warns(UserWarning, match="LAMB needs Adam"):
        opt = fleet.distributed_optimizer(sgd)
    assert opt.inner_opt is sgd
    single(lars=True)
    model = fleet.distributed_model(MLP())
    adam = torch.optim.Adam(model.parameters())
    with pytest.warns(UserWarning, match="LARS needs torch.optim.SGD"):
        opt = fleet.distributed_optimizer(adam)
    assert opt.inner_opt is adam


def test_exclusion_needs_parameter_names(single):
    single(lamb=True, lamb_configs={"exclude_from_weight_decay": ["bias"]})
    net = MLP()  # never passed to distributed_model: no names
    opt = fleet.distributed_optimizer(torch.optim.Adam(net.parameters()))
    F.cross_entropy(net(batch(0, 0)[0]), batch(0, 0)[1]).backward()
    with pytest.raises(ValueError, match="distributed_model"):
        opt.step()


def test_refused_combinations(single):
    single(lars=True)
    model = fleet.distributed_model(MLP())
    with pytest.raises(NotImplementedError, match="nesterov"):
        fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True))
    single(lamb=True)
    model = fleet.distributed_model(MLP())
    with pytest.raises(NotImplementedError, match="amsgrad"):
        fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), amsgrad=True))


@pytest.mark.parametrize("flag, make", [
    ("lamb", lambda ps: torch.optim.Adam(ps, lr=0.01)),
    ("lars", lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9)),
])
def test_a_checkpoint_resumes_exactly_and_keeps_the_scheduler_link(single, flag, make):
    cfg = {"lamb_configs": {"exclude_from_weight_decay": ["bias"]}} if flag == "lamb" else {}
    single(**{flag: True}, **cfg)
    torch.manual_seed(0)
    net = MLP()
    twin = copy.deepcopy(net)
    model = fleet.distributed_model(net)
    opt = fleet.distributed_optimizer(make(model.parameters()))
    _train(model, opt)  # STEPS steps
    saved_model, saved_opt = copy.deepcopy(net.state_dict()), copy.deepcopy(opt.state_dict())
    for t in range(STEPS + 1, STEPS + 3):  # uninterrupted: two more steps
        x, y = batch(t, 0)
        opt.clear_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    single(**{flag: True}, **cfg)
    twin.load_state_dict(saved_model)
    resumed = fleet.distributed_model(twin)
    user_opt = make(resumed.parameters())
    opt2 = fleet.distributed_optimizer(user_opt)
    opt2.load_state_dict(saved_opt)
    for t in range(STEPS + 1, STEPS + 3):
        x, y = batch(t, 0)
        opt2.clear_grad()
        F.cross_entropy(resumed(x), y).backward()
        opt2.step()
    _assert_same(resumed, net)
    user_opt.param_groups[0]["lr"] = 0.123  # a scheduler on the user's optimizer still drives the step
    assert opt2.inner_opt.param_groups[0]["lr"] == 0.123


@pytest.mark.parametrize("fields, match", [
    ({"lamb": True, "lars": True}, "lamb and strategy.lars"),
    ({"lamb": True, "localsgd": True}, "lamb and strategy.localsgd"),
    ({"localsgd": True, "adaptive_localsgd": True}, "localsgd and strategy.adaptive_localsgd"),
    ({"dgc": True, "fp16_allreduce": True}, "dgc with strategy.fp16_allreduce"),
    ({"localsgd": True, "dgc": True}, "localsgd and strategy.dgc"),
    ({"dgc": True, "amp": True}, "dgc with float16 amp"),
])
def test_meta_optimizers_that_do_not_combine_are_refused(single, fields, match):
    single(**fields)
    adam = fields.get("lamb", False)
    model = fleet.distributed_model(MLP())
    opt = torch.optim.Adam(model.parameters()) if adam else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(NotImplementedError, match=match):
        fleet.distributed_optimizer(opt)
