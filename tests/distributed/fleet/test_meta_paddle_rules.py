"""Two of Paddle's rules the meta-optimizers follow, each against Paddle's source written out by hand:
LAMB's exclude_from_weight_decay (the meta-optimizer's ``param.name.endswith``; an excluded parameter gets neither
decay nor the trust ratio, ``paddle.optimizer.Lamb(always_adapt=False)``) and DGC's first step (compressed from
``rampup_begin_step`` 0 on, only for parameters of 16384 elements or more: ``DGCMomentumOptimizer._is_use_dgc``)."""

import torch
import torch.nn.functional as F
from fleet_models import fresh_fleet
from torch import nn

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import DistributedStrategy
from fleetlite.testing import run_ranks

LR, BETAS, EPS, WD, STEPS = 0.01, (0.9, 0.999), 1e-6, 0.1, 4


def _net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 1))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return net


def _batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 5, generator=g), torch.randn(8, 1, generator=g)


def _paddle_lamb(net, exclude):
    """Paddle's lamb kernel per parameter; ``weight_decay`` 0 for an excluded one, and then no trust ratio."""
    m = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    v = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    for t in range(1, STEPS + 1):
        net.zero_grad()
        x, y = _batch(t)
        F.mse_loss(net(x), y).backward()
        with torch.no_grad():
            for n, p in net.named_parameters():
                g = p.grad
                m[n] = BETAS[0] * m[n] + (1 - BETAS[0]) * g
                v[n] = BETAS[1] * v[n] + (1 - BETAS[1]) * g * g
                r = (m[n] / (1 - BETAS[0] ** t)) / ((v[n] / (1 - BETAS[1] ** t)).sqrt() + EPS)
                if any(n.endswith(e) for e in exclude):
                    p -= LR * r
                    continue
                r = r + WD * p
                w_norm, r_norm = p.norm(), r.norm()
                p -= LR * (w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0) * r
    return dict(net.named_parameters())


def test_lamb_excluded_parameters_get_neither_decay_nor_trust_ratio(single):
    exclude = [".bias"]
    single(lamb=True, lamb_configs={"lamb_weight_decay": WD, "exclude_from_weight_decay": exclude})
    ref = _paddle_lamb(_net(), exclude)
    model = fleet.distributed_model(_net())
    opt = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS))
    for t in range(1, STEPS + 1):
        opt.clear_grad()
        x, y = _batch(t)
        F.mse_loss(model(x), y).backward()
        opt.step()
    for name, p in model._layers.named_parameters():
        torch.testing.assert_close(p.detach(), ref[name].detach(), rtol=1e-5, atol=1e-6, msg=name)


def _dgc_first_step(rank, world, sizes):
    fresh_fleet(DistributedStrategy(dgc=True, dgc_configs={"rampup_begin_step": 0, "rampup_step": 1,
                                                           "sparsity": [0.999]}))
    changed = []
    for n in sizes:
        torch.manual_seed(0)
        net = nn.Linear(n, 1)
        before = net.weight.detach().clone()
        model = fleet.distributed_model(net)
        opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        x = torch.randn(8, n, generator=torch.Generator().manual_seed(rank))
        model(x).pow(2).mean().backward()
        opt.step()
        # NaN != anything: a weight turned NaN would count as changed, so it must be finite first
        assert torch.isfinite(net.weight).all(), f"rank {rank}: non-finite weight after the DGC step"
        changed.append(int((net.weight.detach() != before).sum()))
    return changed


def test_dgc_first_step_compresses_only_parameters_paddle_compresses():
    # rampup_begin_step 0: step 0 is already sparse for a weight of 20,000 elements (top int(20000 * 0.001) = 20
    # entries per rank, at most 40 changed); a Linear(1000, 1) weight (under Paddle's 16384) stays dense and all
    # its 1,000 entries change, in Paddle as here (DGCMomentumOptimizer._is_use_dgc)
    for changed in run_ranks(_dgc_first_step, args=([20000, 1000],)):
        assert 20 <= changed[0] <= 40 and changed[1] == 1000, changed
