"""Torch DDP's constructor, static_graph, join(), comm hooks and channels-last, against torch DDP."""

import sys
import threading

import pytest
import torch
import torch.distributed as td
from ddp_cases import MLP, assert_parity, batch, both, snapshot, wrap
from models import Branchy, ConvBN
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.algorithms.join import Join

import fleetlite
from fleetlite.testing import run_ranks


# ---------------------------------------------------------------- constructor
def _ddp_arguments(rank, engine):
    torch.manual_seed(rank)  # different init per rank: only a construction broadcast makes them agree
    net = MLP(3, 8)
    m = wrap(engine, net, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
             process_group=td.group.WORLD, bucket_cap_mb=0.001, find_unused_parameters=False,
             check_reduction=False, gradient_as_bucket_view=True, static_graph=False, init_sync=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(3):
        m(batch(step, rank, 2, 8)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return snapshot(net)


@pytest.mark.timeout(120)
def test_ddp_constructor_arguments_are_accepted_with_ddp_meaning():
    assert_parity(run_ranks(both, args=(_ddp_arguments,)))


def _init_sync_false(rank, engine):
    torch.manual_seed(rank)
    net = nn.Linear(3, 2)
    wrap(engine, net, init_sync=False)
    return net.weight.detach().clone()


@pytest.mark.timeout(60)
def test_init_sync_false_skips_the_construction_broadcast():
    res = run_ranks(both, args=(_init_sync_false,))
    assert_parity(res)
    assert not torch.equal(res[0]["fleetlite"], res[1]["fleetlite"])


def test_paddle_names_and_ddp_aliases_conflict_clearly():
    net = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="comm_buffer_size=5.*bucket_cap_mb=10"):
        fleetlite.DataParallel(net, comm_buffer_size=5, bucket_cap_mb=10)
    with pytest.raises(ValueError, match="`layers`.*`module`"):
        fleetlite.DataParallel(net, module=nn.Linear(2, 2))
    with pytest.raises(ValueError, match="device_ids"):  # a CPU module, as torch DDP
        fleetlite.DataParallel(net, device_ids=[0])
    with pytest.raises(ValueError, match="single element"):
        fleetlite.DataParallel(net, device_ids=[0, 1])
    with pytest.raises(NotImplementedError, match="mixed_precision"):
        fleetlite.DataParallel(net, mixed_precision=object())
    with pytest.raises(TypeError, match="unexpected keyword argument 'bucket_size'"):
        fleetlite.DataParallel(net, bucket_size=3)
    with pytest.raises(ValueError, match="sparse=True"):
        fleetlite.DataParallel(nn.Sequential(nn.Embedding(5, 2, sparse=True), nn.Linear(2, 2)))
    m = fleetlite.DataParallel(module=net, bucket_cap_mb=5, comm_buffer_size=5, gradient_as_bucket_view=True)
    assert m.module is net and m.comm_buffer_size == 5 and m.process_group is None


# ---------------------------------------------------------------- static graph
def _static(rank, engine, unused):
    torch.manual_seed(0)
    net = Branchy()  # `unused` never gets a gradient; `odd` is used on every step
    if unused == "_set_static_graph":  # DDP's older switch
        m = wrap(engine, net)
        m._set_static_graph()
    else:
        m = wrap(engine, net, static_graph=True, find_unused_parameters=unused)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    out = []
    for step in range(5):
        m(batch(step, rank, 3, 6), use_odd=True).pow(2).mean().backward()
        out.append(snapshot(net))
        opt.step()
        opt.zero_grad()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("unused", [False, True, "_set_static_graph"])
def test_static_graph_matches_ddp(unused):
    assert_parity(run_ranks(both, args=(_static, unused)))


def test_static_graph_skips_the_graph_walk_after_the_first_step(monkeypatch):
    import fleetlite.parallel.reducer as red

    calls = []
    monkeypatch.setattr(red, "reachable_params", lambda out: calls.append(1) or set())
    r = red.Reducer([("w", nn.Parameter(torch.ones(2)))], None, 1, 25, 1, True, static_graph=True)
    r._static_counts = [1]
    r.prepare_for_backward(torch.ones(1))
    r._expect_hooks = False
    assert calls == []
    dynamic = red.Reducer([("w", nn.Parameter(torch.ones(2)))], None, 1, 25, 1, True)
    dynamic.prepare_for_backward(torch.ones(1))
    dynamic._expect_hooks = False
    assert calls == [1]  # find_unused_parameters without a static graph walks every step


# ---------------------------------------------------------------------- join
def _join(rank, engine, divide, how, kind="plain"):
    from test_ddp_dropin import SometimesBranch

    torch.manual_seed(0)
    net = SometimesBranch() if kind == "unused" else MLP(3, 8)
    m = wrap(engine, net, find_unused_parameters=kind == "unused")
    if kind == "fp16":
        m.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    n = 5 if rank == 0 else 8  # uneven inputs
    ctx = m.join(divide_by_initial_world_size=divide) if how == "method" else Join(
        [m], divide_by_initial_world_size=divide)
    with ctx:
        for step in range(n):
            if kind == "unused":
                with m.no_sync():
                    m(batch(50 + step, rank, 2, 6), use_odd=step % 3 == rank).sum().backward()
                m(batch(step, rank, 2, 6), use_odd=step % 2 == 0).pow(2).sum().backward()
            else:
                m(batch(step, rank, 2, 8)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
    return snapshot(net)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("divide,how,kind", [(True, "method", "plain"), (False, "Join", "plain"),
                                             (True, "method", "unused"), (True, "method", "fp16")])
def test_join_uneven_inputs_matches_ddp(divide, how, kind):
    res = run_ranks(both, args=(_join, divide, how, kind))
    assert_parity(res, atol=1e-5)
    for k, (p, _) in res[0]["fleetlite"].items():  # the final model is synced from the last joiner
        torch.testing.assert_close(p, res[1]["fleetlite"][k][0], rtol=0, atol=0)


def _join_throw(rank, engine):
    torch.manual_seed(0)
    m = wrap(engine, MLP(2, 4))
    try:
        with m.join(throw_on_early_termination=True):
            for step in range(2 if rank == 0 else 4):
                m(batch(step, rank, 2, 4)).sum().backward()
    except RuntimeError as e:
        return ("exhausted" in str(e) or "Detected at least one rank" in str(e))
    return "no error"


@pytest.mark.timeout(120)
def test_join_throw_on_early_termination_like_ddp():
    for r in run_ranks(both, args=(_join_throw,)):
        assert r == {"ddp": True, "fleetlite": True}


# ---------------------------------------------------------------- comm hooks
def _simple_hook(state, bucket):
    """torch's test_ddp_comm_hook_future_passing_cpu: no communication, every gradient becomes 2."""
    fut = torch.futures.Future()
    fut.set_result(torch.ones_like(bucket.buffer()))
    return fut.then(lambda f: f.value() + torch.ones_like(f.value()))


def _hooked(rank, engine, hook_name):
    torch.manual_seed(0)
    net = MLP(3, 16)
    m = wrap(engine, net)
    if hook_name == "powerSGD":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, random_seed=7)
        m.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif hook_name == "simple":
        m.register_comm_hook(None, _simple_hook)
    else:
        m.register_comm_hook(None, getattr(default_hooks, hook_name))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = []
    for step in range(5):
        m(batch(step, rank, 4, 16)).pow(2).mean().backward()
        out.append(snapshot(net))
        opt.step()
        opt.zero_grad()
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("hook_name", ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "powerSGD",
                                       "simple"])
def test_torch_comm_hooks_work_unchanged_and_match_ddp(hook_name):
    res = run_ranks(both, args=(_hooked, hook_name))
    assert_parity(res, atol=1e-6)


def test_bad_comm_hooks():
    m = fleetlite.DataParallel(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="callable"):
        m.register_comm_hook(None, 3)
    m.register_comm_hook(None, default_hooks.allreduce_hook)
    with pytest.raises(RuntimeError, match="only be called once"):
        m.register_comm_hook(None, default_hooks.allreduce_hook)

    def wrong_return(state, bucket) -> int:
        return 0

    with pytest.raises(ValueError, match="return annotation"):
        fleetlite.DataParallel(nn.Linear(2, 2)).register_comm_hook(None, wrong_return)
    with pytest.raises(RuntimeError, match="comm_dtype"):
        fleetlite.DataParallel(nn.Linear(2, 2), comm_dtype=torch.float16).register_comm_hook(
            None, default_hooks.fp16_compress_hook)


# ------------------------------------------------------------- channels last
def _channels_last(rank, engine):
    torch.manual_seed(0)
    net = ConvBN().to(memory_format=torch.channels_last)
    m = wrap(engine, net)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    strides = []
    for step in range(3):
        x = batch(step, rank, 4, 3, 8, 8).to(memory_format=torch.channels_last)
        m(x).pow(2).mean().backward()
        strides.append(all(p.grad.stride() == p.stride() for p in net.parameters()))
        opt.step()
        opt.zero_grad(set_to_none=step % 2 == 0)
    return snapshot(net), strides


@pytest.mark.timeout(120)
def test_channels_last_gradients_keep_parameter_strides_and_match_ddp():
    res = run_ranks(both, args=(_channels_last,))
    for r in res:
        assert r["fleetlite"][1] == [True, True, True]
        assert_parity([{"ddp": r["ddp"][0], "fleetlite": r["fleetlite"][0]}])


# ---------------------------------------------------- two autograd threads
def _two_threads(rank, world):
    torch.manual_seed(0)
    m = fleetlite.DataParallel(MLP(8, 4), comm_buffer_size=0.0001, last_comm_buffer_size=0.0001)
    r = m._reducer
    launched = []
    orig = r._communicate
    r._communicate = lambda b, buf, grads: (launched.append(b.index), orig(b, buf, grads))
    m(batch(0, rank, 2, 4))  # arms the reducer; hooks are then fired by hand from two threads
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    sys.setswitchinterval(1e-6)  # interleave the two threads as finely as CPython allows
    r._queued = True  # not inside a real backward: _finalize is called by hand below
    start = threading.Barrier(2)
    idx = list(range(len(r.params)))

    def fire(part):
        start.wait()
        for i in part:
            r._on_grad(i)

    threads = [threading.Thread(target=fire, args=(idx[k::2],)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r._finalize()
    return launched, len(r.buckets), [p.grad.clone() for p in m.parameters()]


@pytest.mark.timeout(60)
def test_hooks_from_two_threads_launch_each_bucket_once_in_order():
    for launched, n, grads in run_ranks(_two_threads):
        assert launched == list(range(n))
        for g in grads:
            torch.testing.assert_close(g, torch.ones_like(g))


# ------------------------------------------- no host sync in a synced step
def _deferred_missing(rank, world):
    from test_ddp_dropin import SometimesBranch

    torch.manual_seed(0)
    m = fleetlite.DataParallel(SometimesBranch())
    m._reducer.defer_checks = True  # what CUDA does after the first steps: tail read two forwards later
    reads = []
    orig = m._reducer._check_flags
    m._reducer._check_flags = lambda flags, missing: (  # where the tail is read: inside backward or not
        reads.append(torch._C._current_graph_task_id() != -1), orig(flags, missing))
    for step in range(6):
        try:
            m(batch(step, rank, 2, 6), use_odd=not (step == 3 and rank == 1)).sum().backward()
        except RuntimeError as e:
            return step, str(e), reads
    return "no error"


@pytest.mark.timeout(60)
def test_deferred_tail_check_raises_the_same_error_on_every_rank_at_the_next_forward():
    for step, msg, reads in run_ranks(_deferred_missing):
        assert step == 5  # two forwards after the step that missed a gradient
        assert "rank 1: odd.weight, odd.bias" in msg and "find_unused_parameters=True" in msg
        assert reads == [True, True, False, False]  # read in the first two backwards, then two forwards later


def test_steady_state_cuda_step_defers_the_tail_read():
    from fleetlite.parallel.reducer import Reducer

    r = Reducer([("w", nn.Parameter(torch.ones(2)))], None, 1, 25, 1, False)
    assert r.defer_checks is None  # auto: deferred when the tail lives on a CUDA device


# ------------------------------------------------- parameters DDP is told to ignore
def _ignored(rank, engine):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(rank)  # ignored tensors are neither broadcast nor averaged: they stay per rank
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    DDP._set_params_and_buffers_to_ignore_for_model(net, ["2.weight", "2.bias", "1.running_mean"])
    m = wrap(engine, net)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(3):
        m(batch(step, rank, 4, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return snapshot(net), net[1].running_mean.clone()


@pytest.mark.timeout(120)
def test_params_and_buffers_to_ignore_like_ddp():
    res = run_ranks(both, args=(_ignored,))
    assert_parity(res)
    assert not torch.equal(res[0]["fleetlite"][0]["2.weight"][0], res[1]["fleetlite"][0]["2.weight"][0])
