"""DataParallel against torch DDP and single-process references, on 2 real ranks (gloo)."""

import pytest
import torch
import torch.distributed as td
from models import Branchy, ConvBN, DeepMLP, Tied
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import fleetlite
from fleetlite.distributed.fleet.utils import fused_allreduce_gradients
from fleetlite.testing import RankFailure, run_ranks

MODELS = {"conv": ConvBN, "mlp": DeepMLP, "tied": Tied, "branch": Branchy}


def _assert_every_rank_equal(ours, ref, atol=1e-6):
    """Each rank's replica against the reference's same rank: a wrong replica on any rank fails."""
    assert len(ours) == len(ref)
    for rank, (got, want) in enumerate(zip(ours, ref)):
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=atol,
                                       msg=lambda m, k=k, r=rank: f"rank {r}, {k}: {m}")


def _batch(which, step, rank):
    g = torch.Generator().manual_seed(1000 * rank + step)
    if which == "conv":
        return (torch.randn(4, 3, 8, 8, generator=g),), {}
    if which == "mlp":
        return (torch.randn(4, 16, generator=g),), {}
    if which == "tied":
        return (torch.randint(0, 20, (4, 5), generator=g),), {}
    return (torch.randn(4, 6, generator=g),), {"use_odd": (step + rank) % 2 == 0}


def _train(rank, world, which, engine, no_sync_k=0, set_to_none=True):
    torch.manual_seed(0)
    model = MODELS[which]()
    unused = which == "branch"
    if engine == "ddp":
        m = DDP(model, find_unused_parameters=unused)
    else:  # small buckets so that every model gets several
        m = fleetlite.DataParallel(model, find_unused_parameters=unused, comm_buffer_size=0.01,
                                   last_comm_buffer_size=0.002)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    for step in range(10):
        for micro in range(no_sync_k):
            with m.no_sync():
                args, kw = _batch(which, 100 * step + micro + 1, rank)
                m(*args, **kw).float().pow(2).mean().backward()
        args, kw = _batch(which, 100 * step, rank)
        m(*args, **kw).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", ["conv", "mlp", "tied", "branch"])
def test_parity_with_torch_ddp(which):
    ref = run_ranks(_train, args=(which, "ddp"))
    ours = run_ranks(_train, args=(which, "fleetlite"))
    _assert_every_rank_equal(ours, ref)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("set_to_none", [True, False])
def test_no_sync_accumulation_matches_ddp(set_to_none):
    ref = run_ranks(_train, args=("mlp", "ddp", 2, set_to_none))
    ours = run_ranks(_train, args=("mlp", "fleetlite", 2, set_to_none))
    _assert_every_rank_equal(ours, ref)


def _no_sync_grads(rank, world, k):
    torch.manual_seed(0)
    net = nn.Linear(5, 3)
    m = fleetlite.DataParallel(net)
    for i in range(k):
        with m.no_sync():
            m(torch.full((2, 5), float(rank * 10 + i))).sum().backward()
    m(torch.full((2, 5), float(rank * 10 + k))).sum().backward()
    return net.weight.grad.clone()


@pytest.mark.timeout(60)
def test_no_sync_equals_average_of_all_micro_batches():
    k = 3
    grads = run_ranks(_no_sync_grads, args=(k,))
    torch.manual_seed(0)
    net = nn.Linear(5, 3)
    for rank in range(2):
        for i in range(k + 1):
            net(torch.full((2, 5), float(rank * 10 + i))).sum().backward()
    expected = net.weight.grad / 2
    torch.testing.assert_close(grads[0], expected)
    torch.testing.assert_close(grads[1], expected)


def _grad_views(rank, world):
    torch.manual_seed(rank)  # different init: construction must broadcast rank 0's parameters
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).to(torch.float64), nn.Linear(4, 2))
    net[0].weight.requires_grad_(False)  # frozen
    m = fleetlite.DataParallel(net, comm_buffer_size=0.0001, last_comm_buffer_size=0.00005)
    plan = m.bucket_plan
    params0 = [p.detach().clone() for p in net.parameters()]
    return plan, params0


@pytest.mark.timeout(60)
def test_construction_broadcasts_and_plans_per_dtype_without_frozen():
    res = run_ranks(_grad_views)
    plan, params0 = res[0]
    for a, b in zip(res[0][1], res[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    names = [n for b in plan for n in b["params"]]
    assert "_layers.0.weight" not in names and "0.weight" not in names
    assert sorted(names) == sorted(["0.bias", "1.weight", "1.bias", "2.weight", "2.bias"])
    dtypes = {n: b["dtype"] for b in plan for n in b["params"]}
    assert dtypes["1.weight"] == torch.float64 and dtypes["2.weight"] == torch.float32
    # reduction order: reverse registration order
    order = [n for b in plan for n in b["params"]]
    assert order.index("2.bias") < order.index("1.weight") < order.index("0.bias")


def test_bucket_plan_respects_configured_sizes():
    net = DeepMLP(depth=40, width=32)  # each layer 4224 bytes
    m = fleetlite.DataParallel(net, comm_buffer_size=0.02, last_comm_buffer_size=0.005)
    plan = m.bucket_plan
    cap, last_cap = int(0.02 * 2**20), int(0.005 * 2**20)
    assert all(b["bytes"] <= cap for b in plan[:-1])
    assert plan[-1]["bytes"] <= last_cap
    assert "layers.0.weight" in plan[-1]["params"]
    assert plan[0]["params"][0] == "layers.39.bias"
    total = sum(p.numel() * 4 for p in net.parameters())
    assert sum(b["bytes"] for b in plan) == total
    # every bucket but the last is filled: adding its successor's first tensor would overflow
    assert len(plan) == -(-(total - plan[-1]["bytes"]) // (cap - cap % 4224)) + 1


def _unused_error(rank, world):
    # torch DDP's rule, on its face; Paddle's face trains this model (tests/parallel/test_faces.py)
    torch.manual_seed(0)
    m = fleetlite.DistributedDataParallel(Branchy())
    try:
        m(torch.randn(2, 6), use_odd=(rank == 0)).sum().backward()
    except RuntimeError as e:
        return str(e)
    return "no error"


@pytest.mark.timeout(60)
def test_unused_parameter_error_on_every_rank_without_hang():
    msgs = run_ranks(_unused_error, timeout=60)
    for msg in msgs:
        assert "find_unused_parameters=True" in msg
        assert "unused.weight" in msg and "odd.weight" in msg
        assert "rank 1" in msg


def _mismatch(rank, world):
    net = nn.Sequential(nn.Linear(4, 4 if rank == 0 else 5), nn.Linear(4 if rank == 0 else 5, 1))
    try:
        fleetlite.DataParallel(net)
    except ValueError as e:
        return str(e)
    return "no error"


@pytest.mark.timeout(60)
def test_shape_mismatch_is_a_clear_error_on_every_rank():
    msgs = run_ranks(_mismatch)
    for msg in msgs:
        assert "'0.weight'" in msg and "rank 0" in msg and "rank 1" in msg and "(4, 4)" in msg


def _buffers(rank, world, broadcast):
    torch.manual_seed(0)
    net = ConvBN()
    m = fleetlite.DataParallel(net, broadcast_buffers=broadcast)
    for _ in range(3):
        m(torch.randn(4, 3, 8, 8) + rank).sum().backward()
    for bn in (net.bn1, net.bn2):
        bn.momentum = 0.0  # the next forward leaves the statistics as they are, after any broadcast
    m(torch.randn(4, 3, 8, 8)).sum().backward()
    return net.bn1.running_mean.clone(), net.bn2.running_var.clone()


@pytest.mark.timeout(60)
def test_buffers_follow_rank0_at_each_training_forward():
    (m0, v0), (m1, v1) = run_ranks(_buffers, args=(True,))
    assert torch.equal(m0, m1) and torch.equal(v0, v1)
    (a0, b0), (a1, b1) = run_ranks(_buffers, args=(False,))
    assert not torch.allclose(a0, a1)
    torch.testing.assert_close(a0, m0)  # rank 0 is the authoritative copy either way


def test_world_size_one_is_transparent():
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    m = fleetlite.DataParallel(net)
    assert m.module is net and m._layers is net
    x = torch.randn(4, 3)
    torch.testing.assert_close(m(x), net(x))
    m(x).sum().backward()
    g = net.weight.grad.clone()
    net.zero_grad()
    net(x).sum().backward()
    torch.testing.assert_close(g, net.weight.grad)
    with m.no_sync():
        pass


def test_state_dict_keys_are_unprefixed_and_load_accepts_ddp_prefix():
    net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    m = fleetlite.DataParallel(net)
    sd = m.state_dict()
    assert list(sd) == list(net.state_dict())
    other = fleetlite.DataParallel(nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)))
    other.load_state_dict({"module." + k: v + 1 for k, v in sd.items()})
    torch.testing.assert_close(other.module[0].weight, net[0].weight + 1)
    other.set_state_dict(sd)
    torch.testing.assert_close(other.module[0].weight, net[0].weight)
    plain = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    plain.load_state_dict(m.state_dict())


def _fp16_comm(rank, world, comm_dtype):
    torch.manual_seed(0)
    net = DeepMLP(depth=4)
    m = fleetlite.DataParallel(net, comm_dtype=comm_dtype)
    torch.manual_seed(rank)
    m(torch.randn(8, 16)).pow(2).mean().backward()
    return [p.grad.clone() for p in net.parameters()]


@pytest.mark.timeout(60)
def test_low_precision_communication_is_close_to_fp32():
    ref = run_ranks(_fp16_comm, args=(None,))
    for dt in (torch.float16, torch.bfloat16):
        got = run_ranks(_fp16_comm, args=(dt,))
        tol = 1e-3 if dt == torch.float16 else 1e-2
        for rank in range(2):  # torch.stack(...).max() keeps a NaN, which then fails the comparison
            rel = torch.stack([(a - b).abs().max() / b.abs().max() for a, b in zip(got[rank], ref[rank])]).max()
            assert 0 < rel < tol, (rank, rel)  # rounded through the low-precision dtype: close, not bit-equal
            assert all(a.dtype == torch.float32 for a in got[rank])


def _double_ready(rank, world):
    torch.manual_seed(0)
    net = nn.Linear(3, 3)
    m = fleetlite.DataParallel(net)
    out = m(torch.randn(2, 3))
    out.sum().backward(retain_graph=True)
    g1 = net.weight.grad.clone()
    out.sum().backward()  # no forward in between: not synced, accumulates locally like torch DDP
    return torch.equal(net.weight.grad, 2 * g1)


@pytest.mark.timeout(60)
def test_second_backward_without_forward_does_not_hang():
    assert run_ranks(_double_ready) == [True, True]


def test_bad_arguments():
    with pytest.raises(ValueError, match="comm_buffer_size"):
        fleetlite.DataParallel(nn.Linear(2, 2), comm_buffer_size=0)
    with pytest.raises(ValueError, match="last_comm_buffer_size"):
        fleetlite.DataParallel(nn.Linear(2, 2), last_comm_buffer_size=-1)
    with pytest.raises(TypeError, match="nn.Module"):
        fleetlite.DataParallel(lambda x: x)
    with pytest.raises(ValueError, match="comm_dtype"):
        fleetlite.DataParallel(nn.Linear(2, 2), comm_dtype=torch.int8)


def test_rank_failure_helper_reports_rank():
    with pytest.raises(RankFailure, match="rank 1"):
        run_ranks(_fail_on_rank1)


def _fail_on_rank1(rank, world):
    if rank == 1:
        raise ValueError("boom")
    td.barrier()


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 2)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        return self.a(x), self.b(x)


def _output_left_out(rank, world, engine):
    torch.manual_seed(0)
    net = TwoHeads()
    m = DDP(net, find_unused_parameters=True) if engine == "ddp" else fleetlite.DataParallel(
        net, find_unused_parameters=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        a, b = m(torch.full((2, 4), float(rank + step)))
        (a if (step + rank) % 2 == 0 else b).sum().backward()  # the other head gets no gradient here
        opt.step()
        opt.zero_grad()
    return {k: v.clone() for k, v in net.state_dict().items()}


@pytest.mark.timeout(60)
def test_find_unused_handles_outputs_left_out_of_the_loss_like_ddp():
    ref = run_ranks(_output_left_out, args=("ddp",))
    ours = run_ranks(_output_left_out, args=("fleetlite",))
    _assert_every_rank_equal(ours, ref)


def _big_params(rank, world, engine, set_to_none):
    torch.manual_seed(0)  # Linear(600, 600): 360,000 elements, above the fused copy-and-scale threshold
    net = nn.Sequential(nn.Linear(600, 600), nn.Tanh(), nn.Linear(600, 4))
    m = DDP(net) if engine == "ddp" else fleetlite.DataParallel(net)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for step in range(4):
        with m.no_sync():
            m(torch.randn(3, 600, generator=torch.Generator().manual_seed(50 + step + rank))).sum().backward()
        m(torch.randn(3, 600, generator=torch.Generator().manual_seed(step + 10 * rank))).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    return {k: v.clone() for k, v in net.state_dict().items()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("set_to_none", [True, False])
def test_large_parameters_match_ddp(set_to_none):
    ref = run_ranks(_big_params, args=("ddp", set_to_none))
    ours = run_ranks(_big_params, args=("fleetlite", set_to_none))
    _assert_every_rank_equal(ours, ref)


def test_wrapping_before_init_under_a_launcher_is_an_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    with pytest.raises(RuntimeError, match="init_parallel_env"):
        fleetlite.DataParallel(nn.Linear(2, 2))


def test_nested_data_parallel_state_dict_round_trips_through_the_parent():
    parent = nn.Sequential(fleetlite.DataParallel(nn.Linear(3, 2)), nn.ReLU())
    sd = parent.state_dict()
    assert list(sd) == ["0.weight", "0.bias"]
    other = nn.Sequential(fleetlite.DataParallel(nn.Linear(3, 2)), nn.ReLU())
    other.load_state_dict({k: v + 1 for k, v in sd.items()})
    torch.testing.assert_close(other[0].module.weight, parent[0].module.weight + 1)


def _cast_after_wrap(rank, world):
    m = fleetlite.DataParallel(nn.Linear(3, 2)).double()
    try:
        m(torch.randn(2, 3, dtype=torch.float64))
    except RuntimeError as e:
        return str(e)
    return "no error"


@pytest.mark.timeout(60)
def test_casting_after_wrapping_is_a_clear_error():
    for msg in run_ranks(_cast_after_wrap):
        assert "before wrapping" in msg and "float64" in msg


def _fused_uneven(rank, world):
    a = torch.zeros(2, requires_grad=True)
    b = torch.zeros(2, requires_grad=True)
    a.grad = torch.full((2,), 4.0)
    if rank == 1:
        b.grad = torch.full((2,), 6.0)  # only rank 1 has a gradient for b
    fused_allreduce_gradients([a, b], None)
    return a.grad, b.grad


@pytest.mark.timeout(60)
def test_fused_allreduce_when_ranks_disagree_on_missing_gradients():
    for ga, gb in run_ranks(_fused_uneven):
        torch.testing.assert_close(ga, torch.full((2,), 4.0))
        torch.testing.assert_close(gb, torch.full((2,), 3.0))
