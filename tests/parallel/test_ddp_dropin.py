"""Patterns from torch DDP's own tests, fleetlite against torch DDP on 2 gloo ranks."""

import copy
import io
import pickle

import pytest
import torch
import torch.distributed as td
from ddp_cases import MLP, assert_parity, batch, both, snapshot, wrap
from torch import nn
from torch.utils.checkpoint import checkpoint

import fleetlite
from fleetlite.testing import run_ranks


# ----------------------------------------------------- 1. no_sync + find_unused
class SometimesBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.odd = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x, use_odd):
        h = torch.relu(self.a(x))
        if use_odd:
            h = h + self.odd(h)
        return self.head(h)


def _no_sync_usage(rank, engine, pattern):
    torch.manual_seed(0)
    net = SometimesBranch()
    m = wrap(engine, net, find_unused_parameters=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    out = []
    for step in range(4):
        with m.no_sync():  # `odd` is used only here, only on rank 0 (pattern 0) or on both ranks (pattern 1)
            m(batch(step, rank, 3, 6), use_odd=(rank == 0 or pattern == 1) and step % 2 == 0).sum().backward()
        m(batch(50 + step, rank, 3, 6), use_odd=False).pow(2).mean().backward()
        out.append(snapshot(net))
        opt.step()
        opt.zero_grad()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pattern", [0, 1])
def test_no_sync_usage_is_accumulated_over_the_window_like_ddp(pattern):
    assert_parity(run_ranks(both, args=(_no_sync_usage, pattern)))


# ---------------------------------------------------- 2. undefined gradients
class NoGradFor(torch.autograd.Function):
    """Passes ``x`` through; ``w`` is an input whose gradient is undefined (``None``)."""

    @staticmethod
    def forward(ctx, x, w):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g, None


class UndefinedGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return NoGradFor.apply(self.lin(x), self.w)


def _undefined(rank, engine, set_to_none):
    torch.manual_seed(0)
    net = UndefinedGrad()
    m = wrap(engine, net, find_unused_parameters=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, weight_decay=0.1)  # decay would move `w` if it got zeros
    out = []
    for step in range(3):
        m(batch(step, rank, 2, 4)).sum().backward()
        out.append(snapshot(net))
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    out.append(snapshot(net))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("set_to_none", [True, False])
def test_undefined_gradients_stay_none_like_ddp(set_to_none):
    res = run_ranks(both, args=(_undefined, set_to_none))
    assert_parity(res)
    if set_to_none:
        assert res[0]["fleetlite"][-1]["w"][1] is None
        torch.testing.assert_close(res[0]["fleetlite"][-1]["w"][0], torch.ones(4))


# ------------------------------------------------ 3. exception mid-backward
class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fail):
        ctx.fail = fail
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if ctx.fail:
            raise RuntimeError("simulated out of memory")
        return g, None


class BoomMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.front = MLP(4, 16)
        self.back = MLP(4, 16)

    def forward(self, x, fail=False):
        return self.back(Boom.apply(self.front(x), fail))


def _interrupted(rank, engine, who, set_to_none):
    torch.manual_seed(0)
    net = BoomMLP()
    # small buckets: the back half's all-reduces are launched before the exception
    kw = {} if engine == "ddp" else {"comm_buffer_size": 0.002, "last_comm_buffer_size": 0.001}
    m = wrap(engine, net, **kw)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    errors = []
    for step in range(5):
        if step == 2 and engine == "ddp":
            continue  # the reference skips the failing step altogether
        fail = step == 2 and rank in who
        try:
            m(batch(step, rank, 4, 16), fail=fail).pow(2).mean().backward()
        except RuntimeError as e:
            errors.append(str(e)[:60])
            opt.zero_grad(set_to_none=set_to_none)
            continue
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    return snapshot(net), len(errors)


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:DataParallel. the previous backward")
@pytest.mark.parametrize("who,set_to_none", [((0, 1), False), ((0, 1), True), ((1,), False)])
def test_exception_mid_backward_never_leaves_a_wrong_gradient(who, set_to_none):
    res = run_ranks(both, args=(_interrupted, who, set_to_none))
    for rank, r in enumerate(res):
        ours, n_err = r["fleetlite"]
        ref, _ = r["ddp"]
        for k in ref:
            torch.testing.assert_close(ours[k][0], ref[k][0], rtol=0, atol=1e-6, msg=f"rank {rank} {k}")
        assert n_err == 1  # the failing rank its own error; a rank whose backward completed a clear one


def _interrupted_message(rank, world):
    torch.manual_seed(0)
    m = fleetlite.DataParallel(BoomMLP(), comm_buffer_size=0.002, last_comm_buffer_size=0.001)
    try:
        m(batch(0, rank, 4, 16), fail=rank == 1).sum().backward()
    except RuntimeError as e:
        msg = str(e)
    with pytest.warns(RuntimeWarning, match="discarded") if rank == 1 else _nothing():
        m(batch(1, rank, 4, 16)).sum().backward()
    return msg


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.mark.timeout(60)
def test_interrupted_step_messages():
    msgs = run_ranks(_interrupted_message)
    assert "simulated out of memory" in msgs[1]
    assert "interrupted by an exception on 1 other rank" in msgs[0] and "Skip the optimizer step" in msgs[0]


# ------------------------------------------------------ 4. deepcopy / pickle
def _copies(rank, engine):
    torch.manual_seed(0)
    m = wrap(engine, MLP(3, 8))
    blob = io.BytesIO()
    torch.save(m, blob)  # the whole wrapped model, as users do
    blob.seek(0)
    loaded = torch.load(blob, weights_only=False)
    twin = copy.deepcopy(m)
    pickled = pickle.loads(pickle.dumps(m))
    out = {}
    for name, model in (("deepcopy", twin), ("torch.load", loaded), ("pickle", pickled)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            model(batch(step, rank, 2, 8)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
        out[name] = snapshot(model.module)
    return out


@pytest.mark.timeout(120)
def test_deepcopy_and_pickle_give_working_wrappers_like_ddp():
    res = run_ranks(both, args=(_copies,))
    assert_parity(res)
    for name in ("deepcopy", "torch.load"):  # and they really all-reduced: ranks agree
        for k, (p, _) in res[0]["fleetlite"][name].items():
            torch.testing.assert_close(p, res[1]["fleetlite"][name][k][0], rtol=0, atol=0)


def _copy_with_subgroup(rank, world):
    m = fleetlite.DataParallel(nn.Linear(2, 2), group=td.new_group([0, 1]))
    try:
        copy.deepcopy(m)
    except RuntimeError as e:
        return str(e)
    return "no error"


@pytest.mark.timeout(60)
def test_deepcopy_with_a_subgroup_is_a_clear_error():
    for msg in run_ranks(_copy_with_subgroup):
        assert "default process group" in msg


# ------------------------------------------------------ 5. nothing to train
def _frozen(rank, engine):
    net = nn.Linear(2, 2).requires_grad_(False)
    try:
        wrap(engine, net)
    except RuntimeError as e:
        return "doesn't have any parameter that requires a gradient" in str(e)
    return "accepted"


@pytest.mark.timeout(60)
def test_module_without_trainable_parameters_is_an_error_like_ddp():
    for r in run_ranks(both, args=(_frozen,)):
        assert r == {"ddp": True, "fleetlite": True}


# ------------------------------------------- 6. reentrant checkpointing once
class CheckpointOnce(nn.Module):
    """torch's ``CheckpointOnceModule`` (test_c10d_common.py)."""

    def __init__(self, use_reentrant=True):
        super().__init__()
        self.l1 = nn.Linear(20, 20)
        self.l2 = nn.Linear(20, 20)
        self.use_reentrant = use_reentrant

    def forward(self, inp):
        x = self.l1(inp)
        return checkpoint(self.l2, x, use_reentrant=self.use_reentrant)


class CheckpointTwice(CheckpointOnce):
    def forward(self, inp):
        x = self.l1(inp)
        x = checkpoint(self.l2, x, use_reentrant=self.use_reentrant)
        return checkpoint(self.l2, x, use_reentrant=self.use_reentrant)


class CheckpointTwiceShared(CheckpointTwice):
    def __init__(self, use_reentrant=True):
        super().__init__(use_reentrant)
        self.l1.weight = self.l2.weight


class DynamicCheckpointTwice(CheckpointOnce):
    def __init__(self, use_reentrant=True):
        super().__init__(use_reentrant)
        self.count = 0

    def forward(self, inp):
        layer = self.l1 if self.count % 2 else self.l2
        self.count += 1
        return checkpoint(layer, inp, use_reentrant=self.use_reentrant)


def _shared_sequential(reentrant):
    l1, l2 = nn.Linear(20, 20), nn.Linear(20, 20)
    l1.weight = l2.weight
    return nn.Sequential(l1, l2)


def _checkpointing(rank, engine, cls, reentrant, static, unused, whole=False):
    torch.manual_seed(0)
    net = cls(reentrant)
    m = wrap(engine, net, static_graph=static, find_unused_parameters=unused)
    assert m._get_ddp_logging_data().get("static_graph", 0) == static
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = []
    for step in range(4):
        inp = batch(step, rank, 8, 20).requires_grad_()
        try:
            # `whole`: the wrapped model itself runs inside a checkpoint (torch's run_checkpoint=True)
            y = checkpoint(m, inp, use_reentrant=reentrant) if whole else m(inp)
            y.pow(2).mean().backward()
        except RuntimeError as e:
            return "error: " + ("Expected to mark a variable ready only once" in str(e)) * "DDP's message " + (
                "static_graph" in str(e)) * "mentions static_graph"
        out.append(snapshot(net))
        opt.step()
        opt.zero_grad()
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("reentrant,static,unused", [(True, False, False), (False, False, False),
                                                     (True, True, False), (True, True, True),
                                                     (False, False, True)])
def test_checkpointing_once_like_ddp(reentrant, static, unused):
    res = run_ranks(both, args=(_checkpointing, CheckpointOnce, reentrant, static, unused))
    assert isinstance(res[0]["ddp"], list)  # DDP trains it
    assert_parity(res)


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:DataParallel. the previous backward")
def test_checkpointing_twice_needs_static_graph_like_ddp():
    res = run_ranks(both, args=(_checkpointing, CheckpointTwice, True, True, False))
    assert isinstance(res[0]["ddp"], list)
    assert_parity(res)
    res = run_ranks(both, args=(_checkpointing, CheckpointTwice, True, False, False))
    for r in res:  # refused by both, ours with DDP's message and advice
        assert r["ddp"].startswith("error") and r["fleetlite"] == "error: DDP's message mentions static_graph"


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:DataParallel. the previous backward")
def test_checkpointing_unused_params_like_ddp():
    """torch's test_ddp_checkpointing_unused_params: reentrant + find_unused fails, static graph works."""
    res = run_ranks(both, args=(_checkpointing, CheckpointOnce, True, False, True))
    for r in res:
        assert r["ddp"].startswith("error") and r["fleetlite"].startswith("error: DDP's message")
    assert_parity(run_ranks(both, args=(_checkpointing, CheckpointOnce, True, True, True)))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("reentrant,static", [(True, False), (False, False), (True, True), (False, True)])
def test_checkpointing_the_whole_model_with_weight_sharing_like_ddp(reentrant, static):
    """torch's test_ddp_checkpointing_weight_sharing (run_checkpoint=True)."""
    res = run_ranks(both, args=(_checkpointing, _shared_sequential, reentrant, static, False, True))
    assert isinstance(res[0]["ddp"], list)
    assert_parity(res, atol=1e-5)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("cls,reentrant,static,unused", [(CheckpointTwiceShared, True, True, False),
                                                         (DynamicCheckpointTwice, False, False, True)])
def test_checkpointing_shared_and_dynamic_like_ddp(cls, reentrant, static, unused):
    """torch's test_ddp_checkpointing_twice_weight_sharing and test_ddp_checkpointing_dynamic_module."""
    res = run_ranks(both, args=(_checkpointing, cls, reentrant, static, unused))
    assert isinstance(res[0]["ddp"], list)
    assert_parity(res, atol=1e-5)
