"""Exactly one gradient clip per optimizer step in every layout (Note [who clips]): plain dp, mp2, pp2 through
fleet's ``train_batch`` (with fleet's optimizer and with a plain one), pp2 through ``fleetlite.Trainer``,
``fleetlite.Model`` (Paddle's hapi) under mp2, and gradient merge k=2 (dp2 and mp2) each end where one process
ends that clips the global-batch gradient once with torch's ``clip_grad_norm_`` (Paddle's ``ClipGradByGlobalNorm``:
``g * clip_norm / max(norm, clip_norm)``, the same but for torch's 1e-6) before each SGD step, on every rank.

The clip thresholds are far below the gradients' norm, so a clip left out fails. A clip by one threshold is a
projection (applying it twice changes nothing), so a clip applied twice shows where two clippers meet: the
Trainer's or the Model's ``grad_clip=`` (X) beside the optimizer's own ``_grad_clip`` (Y, smaller). The given one
replaces the optimizer's, so the reference clips by X once; X then Y would end at Y's norm.
"""

import torch
from torch import nn

import fleetlite
from fleetlite.distributed import fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import (
    ColumnParallelLinear,
    LayerDesc,
    PipelineLayer,
    RowParallelLinear,
    is_split,
)
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

X, Y = 0.05, 0.02  # the given clip, the optimizer's own (smaller: a second clip by it would show)
LR, STEPS, ROWS = 0.5, 2, 8  # ROWS: the global batch of a step


def _reference_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4), nn.Linear(4, 1))


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(ROWS, 4, generator=g), 3 * torch.randn(ROWS, 1, generator=g)


def _reference(clip: float) -> dict[str, torch.Tensor]:
    """One process: the global batch's mean loss, torch's clip_grad_norm_ once, SGD; the final weights."""
    net = _reference_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _data(step)
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        assert torch.nn.utils.clip_grad_norm_(net.parameters(), clip) > 4 * clip  # the clip acts
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _init(dp=1, mp=1, pp=1, **fields) -> fleet.DistributedStrategy:
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy(**fields)
    strategy.hybrid_configs = {"dp_degree": dp, "mp_degree": mp, "pp_degree": pp}
    if pp > 1:
        strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": ROWS // 2}
    fleet.init(is_collective=True, strategy=strategy)
    return strategy


def _mp_net() -> nn.Module:
    """The reference's layers with the first two tensor-parallel, holding this rank's slices of its weights."""
    hcg = fleet.get_hybrid_communicate_group()
    net = nn.Sequential(ColumnParallelLinear(4, 8, has_bias=True, gather_output=False), nn.Tanh(),
                        RowParallelLinear(8, 4, input_is_parallel=True), nn.Linear(4, 1))
    _load_slices(net, _reference_net().state_dict(), hcg)
    return net


def _load_slices(net: nn.Module, full: dict, hcg) -> None:
    with torch.no_grad():
        for name, p in net.named_parameters():
            w = full[name]
            p.copy_(w.chunk(hcg.get_model_parallel_world_size(), dim=p.split_axis)[hcg.get_model_parallel_rank()]
                    if is_split(p) else w)


def _diff(net: nn.Module, ref: dict) -> float:
    """Largest difference of this rank's parameters (its slices) from the reference's slices."""
    mine = {n: p.detach().clone() for n, p in net.named_parameters()}
    _load_slices(net, ref, fleet.get_hybrid_communicate_group())  # net now holds the reference's slices
    return max((mine[n] - p).abs().max().item() for n, p in net.named_parameters())


def _full_diff(full: dict, ref: dict) -> float:
    assert sorted(full) == sorted(ref)
    return max((full[k] - ref[k]).abs().max().item() for k in ref)


def _fleet_loop(dp: int, mp: int, k: int) -> float:
    """fleet's own loop: distributed_model, distributed_optimizer over an optimizer carrying Paddle's ``_grad_clip``,
    ``backward(); step(); clear_grad()`` per micro-batch (k of them per step with gradient merge)."""
    fields = {"gradient_merge": True, "gradient_merge_configs": {"k_steps": k, "avg": True}} if k > 1 else {}
    _init(dp=dp, mp=mp, **fields)
    hcg = fleet.get_hybrid_communicate_group()
    net = _mp_net() if mp > 1 else _reference_net()
    model = fleet.distributed_model(net)
    inner = torch.optim.SGD(net.parameters(), lr=LR)
    inner._grad_clip = ClipGradByGlobalNorm(X)
    opt = fleet.distributed_optimizer(inner)
    for step in range(STEPS):
        x, y = _data(step)
        rows = ROWS // dp
        x, y = (t[hcg.get_data_parallel_rank() * rows:][:rows] for t in (x, y))
        for xm, ym in zip(x.chunk(k), y.chunk(k)):
            loss = nn.functional.mse_loss(model(xm), ym)
            loss.backward()
            opt.step()
            opt.clear_grad()
    return _diff(net, _reference(X))


def _stage(loss_fn=None) -> PipelineLayer:
    hcg = fleet.get_hybrid_communicate_group()
    descs = [LayerDesc(nn.Linear, 4, 8), LayerDesc(nn.Tanh), LayerDesc(nn.Linear, 8, 4), LayerDesc(nn.Linear, 4, 1)]
    stage = PipelineLayer(descs, loss_fn=loss_fn, topology=hcg.topology())
    full = _reference_net().state_dict()
    with torch.no_grad():
        for name, p in stage.named_parameters():
            p.copy_(full[name])
    return stage


def _pp_train_batch(fleet_optimizer: bool) -> float:
    """fleet's ``train_batch`` with Paddle's ``_grad_clip`` on fleet's optimizer (it clips in its step) or on a
    plain torch optimizer (``train_batch`` clips)."""
    _init(pp=2)
    model = fleet.distributed_model(_stage(nn.MSELoss()))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    opt._grad_clip = ClipGradByGlobalNorm(X)
    if fleet_optimizer:
        opt = fleet.distributed_optimizer(opt)
    for step in range(STEPS):
        model.train_batch(list(_data(step)), opt)
    return _full_diff(model.full_state_dict(), _reference(X))


def _pp_trainer() -> float:
    """``fleetlite.Trainer`` on pp2: ``compile(grad_clip=X)`` beside the optimizer's own ``_grad_clip = Y``."""
    strategy = _init(pp=2)
    stage = _stage()
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    opt._grad_clip = ClipGradByGlobalNorm(Y)
    t = fleetlite.Trainer(stage, opt, nn.MSELoss(), strategy=strategy, device="cpu")
    t.compile(grad_clip=ClipGradByGlobalNorm(X))
    xs, ys = zip(*(_data(s) for s in range(STEPS)))
    t.fit(torch.utils.data.TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=ROWS, shuffle=False, verbose=0)
    return _full_diff(t.get_weights(), _reference(X))


def _hapi_mp(prepared_before: bool = False) -> float:
    """Paddle's hapi ``fleetlite.Model`` on mp2: ``prepare(grad_clip=X)`` beside the optimizer's ``_grad_clip = Y``;
    ``prepared_before``: the same optimizer was prepared (and set up) once already without ``grad_clip``."""
    _init(mp=2)
    net = _mp_net()
    model = fleetlite.Model(net)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    opt._grad_clip = ClipGradByGlobalNorm(Y)
    if prepared_before:
        model.prepare(opt, nn.MSELoss())
        model.train_batch([_data(0)[0]], [_data(0)[1]], update=False)  # sets up, steps nothing
        opt.zero_grad()
    model.prepare(opt, nn.MSELoss(), grad_clip=ClipGradByGlobalNorm(X))
    for step in range(STEPS):
        x, y = _data(step)
        model.train_batch([x], [y])
    return _diff(net, _reference(X))


ROWS_OF_TABLE = {
    "dp2": lambda: _fleet_loop(dp=2, mp=1, k=1),
    "mp2": lambda: _fleet_loop(dp=1, mp=2, k=1),
    "pp2 train_batch, fleet optimizer": lambda: _pp_train_batch(True),
    "pp2 train_batch, plain optimizer": lambda: _pp_train_batch(False),
    "pp2 Trainer": _pp_trainer,
    "hapi Model mp2": _hapi_mp,
    "hapi Model mp2, the optimizer prepared twice": lambda: _hapi_mp(prepared_before=True),
    "dp2 gradient merge k=2": lambda: _fleet_loop(dp=2, mp=1, k=2),
    "mp2 gradient merge k=2": lambda: _fleet_loop(dp=1, mp=2, k=2),
}


def _table(rank, world):
    torch.set_num_threads(1)
    return {name: row() for name, row in ROWS_OF_TABLE.items()}


def test_one_clip_per_step_in_every_layout():
    for rank, diffs in enumerate(run_ranks(_table, world_size=2, timeout=300)):
        bad = {name: d for name, d in diffs.items() if not d < 1e-5}  # (a NaN fails too)
        assert not bad, f"rank {rank}: clipped updates differ from one process clipped once: {bad}"
