"""PipelineParallel (Paddle's train_batch / eval_batch on torch.distributed.pipelining) against a single process.

Each rank builds its stage from the same seeded reference model (a one-stage PipelineLayer holding every layer),
runs several AdamW steps with both schedules, and compares its losses and its stage's parameters with the
reference run on the whole batch (micro-batches of equal size: the mean of their mean losses is the full mean).
"""

import pytest
import torch
import torch.distributed as td
from hybrid_models import (
    copy_from,
    embedding_layers,
    embedding_loss,
    mlp_batch,
    mlp_descs,
    reference,
    run_cases,
    tied_batch,
    tied_descs,
    tied_loss,
)
from parity import max_abs_diff, worst
from torch import nn

from fleetlite.distributed import fleet
from fleetlite.distributed.fleet.meta_parallel import PipelineLayer, PipelineParallel, SegmentLayers
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

STEPS, ROWS, MICRO = 4, 8, 2
TOL = 1e-5
KINDS, SCHEDULES = ("mlp", "tied", "embedding"), ("1F1B", "FThenB")


def _models(kind):
    if kind == "mlp":
        return mlp_descs, nn.CrossEntropyLoss(), mlp_batch
    if kind == "embedding":
        return embedding_layers, embedding_loss, tied_batch
    return tied_descs, tied_loss, tied_batch


def _parity(rank, world, kind, schedule, pp, scaler=False, clip=None, recompute=0):
    """dp = world // pp replicas; each takes its own ROWS rows; the reference sees all of them.

    ``scaler``: train through fleet.distributed_scaler(GradScaler(init_scale=1024)); float32 scaled by a power of
    two unscales exactly, so the run must still equal the unscaled reference. ``clip``: Paddle's
    ``optimizer._grad_clip = ClipGradByGlobalNorm(clip)`` against torch's clip_grad_norm_ on the whole model.
    ``recompute``: the stages' recompute_interval.
    """
    descs, loss_fn, batch = _models(kind)
    dp = world // pp
    ref = reference(kind)
    torch.manual_seed(1 + rank)  # stages build from different seeds: the copy below must set every weight
    stage = PipelineLayer(descs(), num_stages=pp, loss_fn=loss_fn, recompute_interval=recompute)
    copy_from(stage, ref)
    model = PipelineParallel(stage, accumulate_steps=ROWS // MICRO, micro_batch_size=MICRO, schedule=schedule)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    if clip is not None:
        opt._grad_clip = ClipGradByGlobalNorm(clip)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 2, 0.5)
    grad_scaler = fleet.distributed_scaler(torch.amp.GradScaler("cpu", init_scale=1024.0)) if scaler else None
    d_loss = []
    for step in range(STEPS):
        shards = [batch(step, ROWS, r) for r in range(dp)]
        x, y = shards[rank // pp]
        loss = model.train_batch([x, y], opt, sched, scaler=grad_scaler)
        full_losses = [loss_fn(ref(*(xs if isinstance(xs, tuple) else (xs,))), ys) for xs, ys in shards]
        ref_opt.zero_grad()
        torch.stack(full_losses).mean().backward()
        if clip is not None:
            assert torch.nn.utils.clip_grad_norm_(ref.parameters(), clip) > 2 * clip  # the clip does act
        ref_opt.step()
        ref_sched.step()
        d_loss.append(abs(loss.item() - full_losses[rank // pp].item()))
    d_param = max_abs_diff(stage.state_dict(), ref.state_dict())
    x, y = batch(STEPS, ROWS, 0)
    with torch.no_grad():
        ref_eval = loss_fn(ref(*(x if isinstance(x, tuple) else (x,))), y).item()
    d_eval = abs(model.eval_batch([x, y], compute_loss=True).item() - ref_eval)
    out = model.eval_batch([x, y], compute_loss=False)
    with torch.no_grad():
        ref_out = ref(*(x if isinstance(x, tuple) else (x,)))
    if isinstance(out, tuple):  # a tuple output (Paddle's pp_embedding test): compare the projection
        out, ref_out = out[0], ref_out[0]
    d_out = max_abs_diff(out, ref_out) if model.is_pipeline_last_stage else 0.0
    n_local = sum(p.numel() for p in stage.parameters())
    return {"scale": grad_scaler.get_scale() if scaler else None, "loss": worst(d_loss), "param": d_param,
            "eval": d_eval, "out": d_out, "local": n_local,
            "total": sum(p.numel() for p in ref.parameters())}


def _cases(world):
    """Every run of this file on ``world`` ranks that ends normally, by name: (function, args, kwargs)."""
    if world == 4:
        cases = {("pp4", schedule): (_parity, ("tied", schedule, 4), {}) for schedule in SCHEDULES}
        cases["dp2_pp2"] = (_parity, ("tied", "1F1B", 2), {})
        cases["clip"] = (_parity, ("tied", "1F1B", 2), {"clip": 0.05})
        return cases
    cases = {(kind, schedule): (_parity, (kind, schedule, 2), {}) for kind in KINDS for schedule in SCHEDULES}
    cases["scaler"] = (_parity, ("tied", "1F1B", 2, True), {})
    cases["clip"] = (_parity, ("tied", "1F1B", 2), {"clip": 0.05})
    cases["recompute"] = (_parity, ("mlp", "1F1B", 2), {"recompute": 1})
    for kind in ("mlp", "tied"):
        for evaluate in (False, True):
            cases[("eval", kind, evaluate)] = (_eval_between_steps, (evaluate, kind), {})
    return cases


@pytest.fixture(scope="module")
def runs():
    """``runs(world, name)``: each rank's result of the case ``name`` of ``_cases(world)``; the cases of a world size
    run in one launch for the module."""
    launched = {}

    def get(world, name):
        if world not in launched:
            launched[world] = run_ranks(run_cases, world_size=world, args=(_cases(world),), timeout=600)
        return [out[name] for out in launched[world]]

    return get


@pytest.mark.timeout(700)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("kind", KINDS)
def test_pp2_equals_single_process(kind, schedule, runs):
    results = runs(2, (kind, schedule))
    for r in results:
        assert r["loss"] < TOL and r["param"] < TOL and r["eval"] < TOL and r["out"] < TOL, results
    if kind == "mlp":  # each stage holds only its own layers
        assert all(r["local"] < r["total"] for r in results)
        assert sum(r["local"] for r in results) == results[0]["total"]


@pytest.mark.timeout(700)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pp4_equals_single_process(schedule, runs):
    """Four stages, one layer each: the tied weight is shared by the first and the last stage only."""
    results = runs(4, ("pp4", schedule))
    for r in results:
        assert r["loss"] < TOL and r["param"] < TOL and r["eval"] < TOL and r["out"] < TOL, results


@pytest.mark.timeout(700)
def test_dp2_pp2_equals_single_process(runs):
    results = runs(4, "dp2_pp2")
    for r in results:
        assert r["loss"] < TOL and r["param"] < TOL and r["eval"] < TOL, results


@pytest.mark.timeout(700)
def test_pp2_with_distributed_scaler_equals_single_process(runs):
    results = runs(2, "scaler")
    for r in results:
        assert r["loss"] < TOL and r["param"] < TOL and r["eval"] < TOL, results
        assert r["scale"] == 1024.0  # no inf step: the scale did not back off on any stage


@pytest.mark.timeout(700)
@pytest.mark.parametrize("world", [2, 4])
def test_global_norm_clip_across_stages(world, runs):
    """The tied model: the shared embedding counts once in the norm although two stages hold it."""
    results = runs(world, "clip")
    for r in results:
        assert r["loss"] < TOL and r["param"] < TOL, results


@pytest.mark.timeout(700)
def test_recompute_interval_equals_single_process(runs):
    results = runs(2, "recompute")
    for r in results:
        assert r["loss"] < TOL and r["param"] < TOL, results


def _plain_scaler(rank, world):
    stage = PipelineLayer(mlp_descs(), num_stages=2, loss_fn=nn.CrossEntropyLoss())
    model = PipelineParallel(stage, accumulate_steps=4, micro_batch_size=2)
    x, y = mlp_batch(0)
    try:
        model.train_batch([x, y], torch.optim.SGD(model.parameters(), lr=0.1), scaler=torch.amp.GradScaler("cpu"))
    except TypeError as e:
        return str(e)
    return None


def test_plain_grad_scaler_fails_with_one_line():
    for msg in run_ranks(_plain_scaler, world_size=2, timeout=60):
        assert "fleet.distributed_scaler(scaler)" in msg and "\n" not in msg


def test_segment_layers_as_paddle():
    assert SegmentLayers(list(range(5)), 2).do_segment() == [0, 2, 5]
    assert SegmentLayers(list(range(7)), 3).do_segment() == [0, 2, 4, 7]  # remainder on the last stages
    assert SegmentLayers(list(range(8)), 4).do_segment() == [0, 2, 4, 6, 8]
    descs = mlp_descs()  # Linear at 0, 2, 4: 'layer:Linear' cuts after each matching layer
    assert SegmentLayers(descs, 3, method="layer:Linear").do_segment() == [0, 1, 3, 5]
    with pytest.raises(ValueError, match="do not divide evenly"):
        SegmentLayers(descs, 2, method="layer:Linear").do_segment()


def test_more_stages_than_layers_fails_with_one_line():
    with pytest.raises(ValueError, match=r"2 layer\(s\) for 3 stages") as err:
        PipelineLayer([nn.Linear(2, 2), nn.Linear(2, 2)], num_stages=3)
    assert "\n" not in str(err.value)


def _pipeline_to_data_parallel(rank, world):
    from fleetlite.distributed import fleet

    fleet.init(is_collective=True)  # pp_degree 1
    layer = PipelineLayer(mlp_descs(), num_stages=2, loss_fn=nn.CrossEntropyLoss())
    try:
        fleet.distributed_model(layer)
    except ValueError as e:
        return str(e)
    return None


def test_pipeline_layer_under_data_parallel_fails_with_one_line():
    for msg in run_ranks(_pipeline_to_data_parallel, world_size=2, timeout=60):
        assert msg is not None and "pp_degree" in msg and "\n" not in msg


def _bad_batch(rank, world):
    stage = PipelineLayer(mlp_descs(), num_stages=2, loss_fn=nn.CrossEntropyLoss())
    model = PipelineParallel(stage, accumulate_steps=4, micro_batch_size=2)
    x, y = mlp_batch(0, rows=6)
    try:
        model.train_batch([x, y], torch.optim.SGD(model.parameters(), lr=0.1))
    except ValueError as e:
        td.barrier()
        return str(e)
    return None


def test_batch_not_matching_micro_batches_fails_with_one_line():
    for msg in run_ranks(_bad_batch, world_size=2, timeout=60):  # on every stage
        assert "accumulate_steps * micro_batch_size = 4 * 2 = 8" in msg and "\n" not in msg


def _eval_between_steps(rank, world, evaluate, kind):
    """Two train_batch calls, with or without eval_batch calls (loss-free and with the loss) between them."""
    torch.set_num_threads(1)
    descs, loss_fn, batch = _models(kind)
    ref = reference(kind)
    stage = PipelineLayer(descs(), num_stages=2, loss_fn=loss_fn)
    copy_from(stage, ref)
    model = PipelineParallel(stage, accumulate_steps=ROWS // MICRO, micro_batch_size=MICRO)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    outs = []
    for step in range(3):
        if evaluate and step == 0:  # a schedule's first run (shape inference) may be an evaluation
            outs.append(model.eval_batch([batch(10, ROWS, 0)[0], None], compute_loss=False))
        model.train_batch(list(batch(step, ROWS, 0)), opt)
        if evaluate:
            outs.append(model.eval_batch([batch(10, ROWS, 0)[0], None], compute_loss=False))  # predict: no labels
            model.eval_batch(list(batch(11, ROWS, 0)), compute_loss=True)
    return {k: v.clone() for k, v in stage.state_dict().items()}, outs


@pytest.mark.timeout(700)
@pytest.mark.parametrize("kind", ["mlp", "tied"])
def test_evaluating_between_steps_does_not_change_training(kind, runs):
    """An eval_batch (its schedule runs forward only) between train_batch calls leaves the training as it was:
    the weights after the steps equal a run without evaluation, bit for bit, and the loss-free outputs of the
    last stage are the model's."""
    plain, evaluated = runs(2, ("eval", kind, False)), runs(2, ("eval", kind, True))
    for (w0, _), (w1, _outs) in zip(plain, evaluated):
        for k in w0:
            assert torch.equal(w0[k], w1[k]), k
    assert evaluated[0][1][0] is None and evaluated[1][1][0].shape[0] == ROWS
