"""The engine's two faces: Paddle's DataParallel and torch's DistributedDataParallel, on 2 gloo ranks.

Each case runs against its reference: torch DDP in the same processes (the DDP face), or Paddle's rule from
its reducer.cc / parallel.py (the Paddle face; Paddle is not installed, so the reference is the same model
trained without the parameters it never uses, which is what Paddle's find_unused_vars_once computes).
"""

import pytest
import torch
from ddp_cases import assert_parity, batch, both, snapshot, wrap
from models import ConvBN
from torch import nn

import fleetlite
from fleetlite.testing import run_ranks


def test_faces_are_exported_and_distinct():
    from fleetlite.parallel import DataParallelBase

    assert fleetlite.DistributedDataParallel is fleetlite.parallel.DistributedDataParallel
    assert fleetlite.DataParallel is fleetlite.parallel.DataParallel
    assert issubclass(fleetlite.DataParallel, DataParallelBase)
    assert issubclass(fleetlite.DistributedDataParallel, DataParallelBase)
    assert not issubclass(fleetlite.DistributedDataParallel, fleetlite.DataParallel)
    with pytest.raises(TypeError, match="already wrapped"):
        fleetlite.DistributedDataParallel(fleetlite.DataParallel(nn.Linear(2, 2)))


@pytest.mark.filterwarnings("ignore:`broadcast_buffers` is deprecated:FutureWarning")  # positional True: as torch DDP
def test_ddp_face_has_ddp_signature_and_takes_paddle_keywords():
    import inspect

    ours = list(inspect.signature(fleetlite.DistributedDataParallel).parameters)
    ref = list(inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters)
    assert ours[:len(ref)] == ref  # same names, same positional order
    net = nn.Linear(2, 2)
    m = fleetlite.DistributedDataParallel(net, None, None, 0, True, True, None, 5)  # DDP's positional order
    assert m.module is net and m.comm_buffer_size == 5
    m = fleetlite.DistributedDataParallel(layers=net, comm_buffer_size=3, last_comm_buffer_size=0.5, group=None)
    assert m.module is net and m.comm_buffer_size == 3 and m.last_comm_buffer_size == 0.5
    with pytest.raises(NotImplementedError, match="mixed_precision"):
        fleetlite.DistributedDataParallel(net, mixed_precision=object())


# --------------------------------------- Paddle face: unused parameters found once
class NeverUsed(nn.Module):
    """``spare`` is never used (a head left in the model); ``odd`` is used when asked."""

    def __init__(self, with_spare=True):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.odd = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)
        if with_spare:  # built last: the other layers' initial values do not depend on it
            self.spare = nn.Linear(6, 6)

    def forward(self, x, use_odd=True, use_spare=False):
        h = torch.relu(self.a(x))
        if use_odd:
            h = h + self.odd(h)
        if use_spare:
            h = h + self.spare(h)
        return self.head(h)


def _never_used(rank, world, face, with_spare):
    torch.manual_seed(0)
    net = NeverUsed(with_spare)
    cls = fleetlite.DataParallel if face == "paddle" else fleetlite.DistributedDataParallel
    m = cls(net)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    out = []
    try:
        for step in range(4):
            m(batch(step, rank, 3, 6)).pow(2).mean().backward()
            out.append({k: v for k, v in snapshot(net).items() if not k.startswith("spare")})
            opt.step()
            opt.zero_grad(set_to_none=step % 2 == 0)
    except RuntimeError as e:
        return str(e)
    spare = None if not with_spare else (net.spare.weight.grad, net.spare.weight.detach().clone())
    return out, spare


@pytest.mark.timeout(120)
def test_paddle_face_trains_with_parameters_unused_in_every_step():
    ours = run_ranks(_never_used, args=("paddle", True))
    ref = run_ranks(_never_used, args=("paddle", False))  # Paddle's numbers: the model without the spare head
    torch.manual_seed(0)
    untouched = NeverUsed().spare.weight.detach()
    for rank in range(2):
        (got, spare), (want, _) = ours[rank], ref[rank]
        assert_parity([{"ddp": want, "fleetlite": got}])
        grad, weight = spare
        assert grad is None  # as Paddle: a parameter that never had a gradient gets none (no weight decay)
        torch.testing.assert_close(weight, untouched, rtol=0, atol=0)


@pytest.mark.timeout(120)
def test_ddp_face_keeps_ddps_unused_parameter_error():
    for msg in run_ranks(_never_used, args=("ddp", True)):
        assert "spare.weight" in msg and "find_unused_parameters=True" in msg


def _set_changes(rank, world, change):
    torch.manual_seed(0)
    m = fleetlite.DataParallel(NeverUsed())
    for step in range(4):
        later = step >= 2
        use_spare = later and change == "now used" and rank == 1
        use_odd = not (later and change == "now unused" and rank == 0)
        try:
            m(batch(step, rank, 3, 6), use_odd=use_odd, use_spare=use_spare).sum().backward()
        except RuntimeError as e:
            return step, str(e)
    return "no error"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("change", ["now used", "now unused"])
def test_paddle_face_raises_on_every_rank_when_the_unused_set_changes(change):
    for step, msg in run_ranks(_set_changes, args=(change,)):
        assert step == 2  # the step where the set changed, on both ranks: never a hang
        assert "find_unused_parameters=True" in msg and "first training step" in msg
        if change == "now used":
            assert "rank 1: spare.weight, spare.bias (unused on the first step, a gradient now)" in msg
        else:
            assert "rank 0: odd.weight, odd.bias (used on the first step, no gradient now)" in msg


def _asymmetric_first_step(rank, world):
    """`odd` unused on rank 1 only at the first step: Paddle's rank 1 would keep None and drift."""
    torch.manual_seed(0)
    net = NeverUsed(with_spare=False)
    m = fleetlite.DataParallel(net)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(3):
        m(batch(step, rank, 3, 6), use_odd=rank == 0).sum().backward()
        opt.step()
        opt.zero_grad()
    return {k: v[0] for k, v in snapshot(net).items()}


@pytest.mark.timeout(120)
def test_paddle_face_gives_a_parameter_used_on_some_ranks_the_average_everywhere():
    r0, r1 = run_ranks(_asymmetric_first_step)
    for k in r0:
        torch.testing.assert_close(r0[k], r1[k], rtol=0, atol=0, msg=k)  # replicas stay identical


# ------------------------------------------------- 1. buffers synced at construction
def _init_buffers(rank, engine, kw):
    torch.manual_seed(rank)
    net = ConvBN()
    net.bn1.running_mean.fill_(float(rank + 1))
    wrap(engine, net, **kw)
    return net.bn1.running_mean.clone(), net.conv1.weight.detach().clone()


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("kw", [{}, {"broadcast_buffers": True}, {"broadcast_buffers": False},
                                {"forward_sync_buffers": False}, {"forward_sync_buffers": True},
                                {"broadcast_buffers": False, "forward_sync_buffers": False},
                                {"init_sync": False}])
def test_buffers_at_construction_like_ddp(kw):
    assert_parity(run_ranks(both, args=(_init_buffers, kw)))


def _paddle_init_buffers(rank, world):
    torch.manual_seed(rank)
    net = ConvBN()
    net.bn1.running_mean.fill_(float(rank + 1))
    fleetlite.DataParallel(net)
    return net.bn1.running_mean.clone()


@pytest.mark.timeout(60)
def test_paddle_face_syncs_buffers_at_construction_like_paddle():
    for mean in run_ranks(_paddle_init_buffers):  # Paddle's sync_params_buffers: rank 0's buffers everywhere
        torch.testing.assert_close(mean, torch.ones(8))


# torch 2.14's keywords: every combination, buffers after construction and after each kind of forward
_BUFFER_KWS = [{}, {"broadcast_buffers": True}, {"broadcast_buffers": False}, {"forward_sync_buffers": False},
               {"forward_sync_buffers": True}, {"broadcast_buffers": False, "forward_sync_buffers": True},
               {"broadcast_buffers": True, "forward_sync_buffers": False}, {"init_sync": False},
               {"init_sync": False, "forward_sync_buffers": True}, {"init_sync": False, "broadcast_buffers": False}]


def _buffers_through_forwards(rank, engine):
    out = []
    for kw in _BUFFER_KWS:
        torch.manual_seed(0)
        net = ConvBN()
        net.bn1.running_mean.fill_(float(rank + 1))  # rank-local buffers before wrapping
        m = wrap(engine, net, **kw)

        def bufs(net=net):
            return {n: b.clone() for n, b in net.named_buffers()}

        seen = {"init": bufs()}
        for step in range(2):  # synced training forwards: the second follows a synced one
            m(batch(step, rank, 4, 3, 8, 8) + rank).pow(2).mean().backward()
            seen[f"train{step}"] = bufs()
        m.eval()
        with torch.no_grad():
            m(batch(9, rank, 4, 3, 8, 8))
        seen["eval"] = bufs()
        out.append((kw, seen, m.broadcast_buffers))
    return out


@pytest.mark.timeout(240)
@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch DDP's deprecation of broadcast_buffers
def test_buffers_after_construction_and_forward_under_every_keyword_like_ddp():
    """torch's nn/parallel/distributed.py: ``forward_sync_buffers`` (when given) decides the forward broadcasts and
    buffers are still synced at construction; else ``broadcast_buffers`` (default True) decides both;
    ``init_sync=False`` skips the construction sync. Every rank's buffers equal torch DDP's on that rank."""
    res = run_ranks(both, args=(_buffers_through_forwards,))
    assert_parity(res)
    # torch's documented meaning, on rank 1 (whose buffers differ from rank 0's before wrapping)
    init = {str(kw): seen["init"]["bn1.running_mean"] for kw, seen, _ in res[1]["fleetlite"]}
    torch.testing.assert_close(init["{'forward_sync_buffers': False}"], torch.full((8,), 1.0))  # synced at init
    torch.testing.assert_close(init["{'broadcast_buffers': False}"], torch.full((8,), 2.0))  # not synced
    torch.testing.assert_close(init["{'init_sync': False}"], torch.full((8,), 2.0))


_WARN_KWS = [{"broadcast_buffers": False}, {"broadcast_buffers": True, "forward_sync_buffers": True},
             {"forward_sync_buffers": False}, {}]


def _future_warnings(rank, engine):
    import warnings

    out = []
    for kw in _WARN_KWS:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            wrap(engine, nn.Linear(2, 2), **kw)
        out.append([str(w.message) for w in got if issubclass(w.category, FutureWarning)])
    return out


@pytest.mark.timeout(120)
def test_broadcast_buffers_deprecation_warning_like_ddp():
    """torch 2.14's DDP warns (FutureWarning, its text) when the deprecated ``broadcast_buffers`` is given."""
    res = run_ranks(both, args=(_future_warnings,))
    assert_parity(res)
    assert [len(w) for w in res[0]["fleetlite"]] == [1, 1, 0, 0]

def _names_and_mesh(rank, engine):
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(rank)
    net = ConvBN()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    m = wrap(engine, net, device_mesh=mesh)
    m(batch(0, rank, 4, 3, 8, 8)).pow(2).mean().backward()
    return {"params": [n for n, _ in m.named_parameters()], "buffers": [n for n, _ in m.named_buffers()],
            "modules": [n for n, _ in m.named_modules()], "mesh": m.device_mesh is mesh,
            "group": m.process_group is mesh.get_group(0), "grads": snapshot(net),
            "get_parameter": m.get_parameter("module.fc.weight").shape}


@pytest.mark.timeout(120)
def test_ddp_face_names_and_device_mesh_like_ddp():
    """``named_parameters()`` (and buffers, modules) are prefixed ``module.`` as torch DDP's; ``device_mesh=`` reduces
    over the mesh's group, as torch DDP does."""
    res = run_ranks(both, args=(_names_and_mesh,))
    assert_parity(res)
    assert res[0]["fleetlite"]["params"][0] == "module.conv1.weight"


def _paddle_face_names(rank, world):
    import warnings

    m = fleetlite.DataParallel(nn.Linear(2, 2))
    loss = m(torch.ones(1, 2)).sum()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaled = m.scale_loss(loss)
        scaled.backward()
        applied = m.apply_collective_grads()
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    return ([n for n, _ in m.named_parameters()], scaled is loss, applied, m.weight.grad.clone(),
            len(deprecations), {w.filename for w in deprecations})


@pytest.mark.timeout(60)
def test_paddle_face_keeps_layers_names_and_paddle_2_methods():
    """Paddle's DataParallel (python/paddle/distributed/parallel.py): the wrapped layer is ``_layers``, so names are
    ``_layers.weight``; Paddle 2.x's ``scale_loss(loss)`` returns the loss unchanged and
    ``apply_collective_grads()`` does nothing (the gradients are already averaged in backward)."""
    for names, same, applied, grad, warned, where in run_ranks(_paddle_face_names):
        assert names == ["_layers.weight", "_layers.bias"] and same and applied is None
        assert warned == 2 and where == {__file__}  # Paddle's @deprecated warning, at the caller's line
        torch.testing.assert_close(grad, torch.ones(2, 2), rtol=0, atol=0)  # the same batch on both ranks


# ------------------------------------------------------------- 2. functional_call
def _functional_call(rank, engine):
    """torch's test_stateless_api_with_ddp, on two ranks."""
    torch.manual_seed(0)
    module = nn.Linear(1, 1)
    m = wrap(engine, module)
    x = torch.rand((1, 1), generator=torch.Generator().manual_seed(rank))
    weight = torch.tensor([[1.0]], requires_grad=True)
    bias = torch.tensor([0.0], requires_grad=True)
    res = torch.func.functional_call(m, {"module.weight": weight, "module.bias": bias}, x)
    res.backward()
    out = {"res": res.detach(), "x": x, "w.grad": weight.grad, "b.grad": bias.grad,
           "module.grad": module.weight.grad, "module.weight": module.weight.detach().clone()}
    m(x).sum().backward()  # an ordinary step afterwards still averages across ranks
    out["after"] = module.weight.grad.clone()
    return out


@pytest.mark.timeout(120)
def test_functional_call_through_the_wrapper_like_ddp():
    res = run_ranks(both, args=(_functional_call,))
    assert_parity(res)
    for r in res:
        torch.testing.assert_close(r["fleetlite"]["res"], r["fleetlite"]["x"])
        assert r["fleetlite"]["w.grad"] is not None and r["fleetlite"]["module.grad"] is None
    torch.testing.assert_close(res[0]["fleetlite"]["after"], res[1]["fleetlite"]["after"], rtol=0, atol=0)


# ----------------------------------------------- 3. a comm hook that returns no future
def _returns_int(state, bucket):
    return 1


def _bad_hook(rank, engine):
    torch.manual_seed(0)
    m = wrap(engine, nn.Linear(4, 4))
    m.register_comm_hook(state=None, hook=_returns_int)
    try:
        m(batch(0, rank, 2, 4)).mean().backward()
    except RuntimeError as e:
        return "callback must return a torch.futures.Future object, but got" in str(e)
    return "no error"


@pytest.mark.timeout(120)
def test_comm_hook_returning_no_future_gets_ddps_error():
    for r in run_ranks(both, args=(_bad_hook,)):
        assert r == {"ddp": True, "fleetlite": True}


# ------------------------------------- 4. buffers in the forward after a synced step
def _validation_after_training(rank, engine, face, pattern):
    """imagenet/main.py's shape: train, then validate in eval mode under no_grad; BatchNorm on rank data."""
    torch.manual_seed(0)
    net = ConvBN()
    if face == "paddle" and engine == "fleetlite":
        m = fleetlite.DataParallel(net)
    else:
        m = wrap(engine, net)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    seen = []
    for epoch in range(2):
        m.train()
        for step in range(2):
            x = batch(10 * epoch + step, rank, 4, 3, 8, 8) + rank
            if pattern == "no_sync":  # gradient accumulation: only the window's first forward broadcasts
                with m.no_sync():
                    m(x).pow(2).mean().backward()
            m(x * 0.5).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        m.eval()
        with torch.no_grad():
            out = m(batch(99, 0, 4, 3, 8, 8))  # the same validation batch on every rank
        seen.append((out, {k: v.clone() for k, v in net.state_dict().items() if "running" in k}))
    return seen


@pytest.mark.timeout(180)
@pytest.mark.parametrize("face,pattern", [("ddp", "plain"), ("ddp", "no_sync"), ("paddle", "plain")])
def test_eval_after_a_synced_step_sees_rank0_buffers_like_ddp(face, pattern):
    res = run_ranks(both, args=(_validation_after_training, face, pattern))
    assert_parity(res, atol=1e-5)
    for (out0, bufs0), (out1, bufs1) in zip(res[0]["fleetlite"], res[1]["fleetlite"]):
        torch.testing.assert_close(out0, out1, rtol=0, atol=0)  # validation agrees across ranks
        for k in bufs0:
            torch.testing.assert_close(bufs0[k], bufs1[k], rtol=0, atol=0)


# ------------------------------------------------------- 5. distributed autograd
def _under_rpc(rank, world, port, engine):
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc

    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}")
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    try:
        torch.manual_seed(0)
        m = wrap(engine, nn.Linear(4, 2))
        with dist_autograd.context() as cid:
            loss = m(batch(0, rank, 3, 4)).sum()
            try:
                dist_autograd.backward(cid, [loss])
            except RuntimeError as e:
                return str(e)
            return {tuple(g.shape): g for g in dist_autograd.get_gradients(cid).values()}
    finally:
        rpc.shutdown()


@pytest.mark.timeout(120)
def test_distributed_autograd_is_refused_naming_rpc_on_every_rank():
    from fleetlite.testing import free_port

    ref = run_ranks(_under_rpc, args=(free_port(), "ddp"))
    assert all(isinstance(r, dict) and len(r) == 2 for r in ref)  # torch DDP supports it: we refuse instead
    for msg in run_ranks(_under_rpc, args=(free_port(), "fleetlite")):
        assert "torch.distributed.rpc" in msg and "dist_autograd" in msg and "DistributedDataParallel" in msg
        assert "received no gradient in this backward pass, so their" not in msg


def _paddle_join(rank, world, with_spare, n1):
    torch.manual_seed(0)
    net = NeverUsed(with_spare)
    m = fleetlite.DataParallel(net)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with m.join():
        for step in range(5 - n1 if rank == 1 else 0, 5):  # rank 1 has n1 batches (0: joined before step 1)
            m(batch(step, rank, 3, 6)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return {k: v for k, v in snapshot(net).items() if not k.startswith("spare")}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n1", [0, 2])
def test_paddle_face_finds_unused_once_under_join_too(n1):
    """A rank that joined before the first step mirrors the first step's agreement: no hang, same numbers."""
    got = run_ranks(_paddle_join, args=(True, n1))
    want = run_ranks(_paddle_join, args=(False, n1))
    assert_parity([{"ddp": w, "fleetlite": g} for g, w in zip(got, want)])
