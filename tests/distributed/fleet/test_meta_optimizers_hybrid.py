"""The meta-optimizers under hybrid_configs (real gloo ranks), each against one process on the full model:
local SGD and DGC act over the data-parallel group only, LAMB's and LARS' norms are the whole tensors' (summed over
the model-parallel group), and a model without tensor-parallel layers under mp says it is replicated."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import DistributedStrategy
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_optimizers import DGCMomentum
from fleetlite.distributed.fleet.meta_parallel import ColumnParallelLinear, RowParallelLinear, is_split
from fleetlite.testing import run_ranks

STEPS = 5


class TPNet(nn.Module):
    """column (output features split) -> tanh -> row (input features split), Ref's layers sliced over mp."""

    def __init__(self):
        super().__init__()
        self.up = ColumnParallelLinear(8, 16, has_bias=True, gather_output=False)
        self.down = RowParallelLinear(16, 4, input_is_parallel=True)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


class Ref(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 4)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


def _ref_model():
    torch.manual_seed(0)
    ref = Ref()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.3 * torch.randn_like(p))  # no zero bias: every trust ratio is a real one
    return ref


def _batches(steps=STEPS, parts=1, rows=6):
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(parts * rows, 8, generator=g), torch.randn(parts * rows, 4, generator=g))
            for _ in range(steps)]


def _init(degrees, **fields):
    fleet_impl._reset()
    s = DistributedStrategy(**fields)
    s.hybrid_configs = degrees
    fleet.init(is_collective=True, strategy=s)
    return fleet.get_hybrid_communicate_group()


def _local(full, param, hcg):
    if not is_split(param):
        return full
    return full.chunk(hcg.get_model_parallel_world_size(), dim=param.split_axis)[hcg.get_model_parallel_rank()]


def _tp_from(ref, hcg):
    net = TPNet()
    with torch.no_grad():
        full = dict(ref.named_parameters())
        for name, p in net.named_parameters():
            p.copy_(_local(full[name], p, hcg))
    return net


def _assert_slices_equal(net, ref, hcg, tol):
    full = dict(ref.named_parameters())
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), _local(full[name], p, hcg).detach(), atol=tol, rtol=tol, msg=name)


def _train(model, opt, batches, part=0, rows=6):
    for x, y in batches:
        opt.clear_grad()
        F.mse_loss(model(x[part * rows:(part + 1) * rows]), y[part * rows:(part + 1) * rows]).backward()
        opt.step()


# -- one-process references (Paddle's formulas, whole tensors) -------------------------------------------------------
def _lamb_reference(ref, batches, lr, wd, betas=(0.9, 0.999), eps=1e-6):
    m = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    v = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    for t, (x, y) in enumerate(batches, 1):
        ref.zero_grad()
        F.mse_loss(ref(x), y).backward()
        with torch.no_grad():
            for n, p in ref.named_parameters():
                g = p.grad
                m[n] = betas[0] * m[n] + (1 - betas[0]) * g
                v[n] = betas[1] * v[n] + (1 - betas[1]) * g * g
                r = (m[n] / (1 - betas[0] ** t)) / ((v[n] / (1 - betas[1] ** t)).sqrt() + eps) + wd * p
                w_norm, r_norm = p.norm(), r.norm()
                p -= lr * (w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0) * r


def _lars_reference(ref, batches, lr, mu, coeff, wd, eps):
    vel = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    for x, y in batches:
        ref.zero_grad()
        F.mse_loss(ref(x), y).backward()
        with torch.no_grad():
            for n, p in ref.named_parameters():
                g = p.grad
                w_norm, g_norm = p.norm(), g.norm()
                local_lr = lr * coeff * w_norm / (g_norm + wd * w_norm + eps) if w_norm > 0 and g_norm > 0 else lr
                vel[n] = mu * vel[n] + local_lr * (g + wd * p)
                p -= vel[n]


def _sgd_reference(ref, batches, lr, mu=0.0):
    opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=mu)
    for x, y in batches:
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt.step()


# -- lamb / lars: the trust ratio of the whole tensor ----------------------------------------------------------------
def _lamb_lars_mp2(rank, world, which):
    fields = ({"lamb": True, "lamb_configs": {"lamb_weight_decay": 0.05}} if which == "lamb" else
              {"lars": True, "lars_configs": {"lars_coeff": 0.01, "lars_weight_decay": 0.01, "epsilon": 1e-8}})
    hcg = _init({"mp_degree": 2, "dp_degree": 1}, **fields)
    ref = _ref_model()
    model = fleet.distributed_model(_tp_from(ref, hcg))
    user = (torch.optim.Adam(model.parameters(), lr=0.01) if which == "lamb" else
            torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9))
    opt = fleet.distributed_optimizer(user)
    assert opt.meta.applied == [which]
    batches = _batches()
    _train(model, opt, batches)
    if which == "lamb":
        _lamb_reference(ref, batches, lr=0.01, wd=0.05)
    else:
        _lars_reference(ref, batches, lr=0.5, mu=0.9, coeff=0.01, wd=0.01, eps=1e-8)
    _assert_slices_equal(model._layers, ref, hcg, tol=1e-5)


@pytest.mark.parametrize("which", ["lamb", "lars"])
def test_lamb_and_lars_under_mp2_use_the_whole_tensors_norms(which):
    run_ranks(_lamb_lars_mp2, args=(which,))


# -- local SGD and DGC: over the data-parallel group only ------------------------------------------------------------
def _one_dp_rank(rank, world, which, degrees):
    fields = {which: True}
    if which == "dgc":
        fields["dgc_configs"] = {"rampup_begin_step": 0, "rampup_step": 1, "sparsity": [0.5]}
    hcg = _init(degrees, **fields)
    ref = _ref_model()
    # under pp2 a plain module's parameters stand for this stage's (no pipeline model needed to build the optimizer)
    model = fleet.distributed_model(_tp_from(ref, hcg)) if degrees.get("mp_degree", 1) > 1 else copy.deepcopy(ref)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    said = [str(w.message) for w in caught if f"strategy.{which} is on" in str(w.message)]
    assert len(said) == 1 and "data-parallel group has one rank" in said[0] and "not applied" in said[0], said
    assert opt.meta.applied == [] and opt.inner_opt is opt.user_opt
    batches = _batches()
    _train(model, opt, batches)  # plain SGD with momentum: what one process does on the whole model
    _sgd_reference(ref, batches, lr=0.1, mu=0.9)
    _assert_slices_equal(getattr(model, "_layers", model), ref, hcg, tol=1e-5)


@pytest.mark.parametrize("which", ["localsgd", "adaptive_localsgd", "dgc"])
@pytest.mark.parametrize("degrees", [{"mp_degree": 2, "dp_degree": 1}, {"pp_degree": 2, "dp_degree": 1}],
                         ids=["mp2", "pp2"])
def test_local_sgd_and_dgc_with_one_data_parallel_rank_are_not_applied(which, degrees):
    run_ranks(_one_dp_rank, args=(which, degrees))


def _mp2_dp2(rank, world, which):
    fields = {which: True}
    if which == "localsgd":
        fields["localsgd_configs"] = {"k_steps": 2, "begin_step": 1}
    else:  # dense until after the run: the DGC hook all-reduces over the dp group
        fields["dgc_configs"] = {"rampup_begin_step": 100, "rampup_step": 1, "sparsity": [0.5]}
    hcg = _init({"mp_degree": 2, "dp_degree": 2}, **fields)
    dp = hcg.get_data_parallel_rank()
    ref = _ref_model()
    model = fleet.distributed_model(_tp_from(ref, hcg))
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    assert opt.meta.applied == [which]
    batches = _batches(parts=2)
    _train(model, opt, batches, part=dp)
    if which == "dgc":
        assert isinstance(opt.inner_opt, DGCMomentum) and opt.meta.dgc_state.iter == STEPS
        _sgd_reference(ref, batches, lr=0.1, mu=0.9)  # dense data parallel = one process on the whole batch
        _assert_slices_equal(model._layers, ref, hcg, tol=1e-5)
        return
    # local SGD by hand: step 1 is data parallel, then each dp replica steps on its own rows and the two
    # replicas' parameters are averaged after steps 3 and 5 (begin_step + k, + 2k)
    twins = [copy.deepcopy(ref), copy.deepcopy(ref)]
    opts = [torch.optim.SGD(t.parameters(), lr=0.1, momentum=0.9) for t in twins]
    for step, (x, y) in enumerate(batches, 1):
        for part, (twin, o) in enumerate(zip(twins, opts)):
            o.zero_grad()
            rows = slice(None) if step == 1 else slice(part * 6, (part + 1) * 6)
            F.mse_loss(twin(x[rows]), y[rows]).backward()
            o.step()
        if step in (3, 5):
            with torch.no_grad():
                for a, b in zip(twins[0].parameters(), twins[1].parameters()):
                    a.copy_((a + b) / 2)
                    b.copy_(a)
    _assert_slices_equal(model._layers, twins[dp], hcg, tol=1e-5)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("which", ["localsgd", "dgc"])
def test_local_sgd_and_dgc_under_mp2_dp2_act_over_the_data_parallel_group(which):
    run_ranks(_mp2_dp2, world_size=4, args=(which,), timeout=200)


def _pp2_dp2_refused(rank, world, which):
    _init({"pp_degree": 2, "dp_degree": 2}, **{which: True})
    with pytest.raises(NotImplementedError, match=f"strategy.{which} with pp_degree > 1"):
        fleet.distributed_optimizer(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9))


@pytest.mark.timeout(240)
def test_local_sgd_and_dgc_under_pp_with_several_data_parallel_ranks_are_refused():
    run_ranks(_pp2_dp2_refused, world_size=4, args=("localsgd",), timeout=200)


# -- mp on a model without tensor-parallel layers ---------------------------------------------------------------------
def _replicated_model(rank, world):
    _init({"mp_degree": 2, "dp_degree": 1})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fleet.distributed_model(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)))
        fleet.distributed_model(nn.Linear(4, 1))
        fleet.distributed_model(TPNet())
    said = [str(w.message) for w in caught if "no tensor-parallel layers" in str(w.message)]
    assert len(said) == 1, said  # once per process
    assert "mp_degree=2" in said[0] and "replicated over the model-parallel group" in said[0]


def test_mp_on_a_model_without_tensor_parallel_layers_says_it_is_replicated_once():
    run_ranks(_replicated_model)
