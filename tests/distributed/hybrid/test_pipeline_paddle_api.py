"""Paddle's pipeline API beyond one chunk per stage, each against a hand-written single-process torch model:

- interleaved (virtual) stages: ``PipelineLayer(..., num_virtual_pipeline_stages=v)``, chunk ``i`` on stage
  ``i % pp`` (Paddle's assignment), on torch's ``ScheduleInterleaved1F1B`` ("1F1B"/"VPP") or ``ScheduleLoopedBFS``
  ("FThenB"); a tied layer in two chunks of one stage; full-state and DCP checkpoints by global layer index;
- fewer micro-batches than stages (``accumulate_steps=1`` on pp2, which Paddle's 1F1B runs);
- ``seg_method`` as a list of boundaries; micro-batches given as a list; several loss functions with
  ``train_batch(..., loss_fn_idx=, return_micro_batch_loss=)``;
- float16 amp as Paddle's hybrid_parallel_pp_amp test (autocast around ``train_batch``, a GradScaler from
  2**5, SGD with a global-norm clip of 1.0), the losses within its ``rtol=5e-5`` of the reference's, which
  runs the whole batch as Paddle's (measured: 3.9e-5 relative, parameters within 6.3e-5, one chunk or two).

The reference takes the same rows; its gradient is the mean over every micro-batch of every data-parallel
replica (Paddle's: each micro-batch loss divided by ``accumulate_steps``, averaged over dp).
"""

import pytest
import torch
import torch.distributed as td
from hybrid_models import (
    copy_from,
    deep_descs,
    init_fleet,
    mlp_batch,
    mlp_descs,
    reference,
    run_cases,
    tied_batch,
    tied_descs,
    tied_loss,
    tied_tail_descs,
)
from parity import max_abs_diff, worst
from torch import nn

from fleetlite.distributed import fleet
from fleetlite.distributed.fleet.meta_parallel import PipelineLayer, PipelineParallel, SegmentLayers
from fleetlite.distributed.fleet.meta_parallel.hybrid_state import dcp_state, load_dcp_state
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

TOL = 1e-5
ROWS = 8


def _ce(out, y):
    return nn.functional.cross_entropy(out, y)


def _square(out, y):
    return 0.1 * out.square().mean() + 0.0 * y.float().mean()


def _model(kind):
    """(descs, reference, batch, loss functions)."""
    if kind == "tied_tail":
        return tied_tail_descs, lambda: reference("tied_tail"), tied_batch, [tied_loss]
    if kind == "mlp":
        return mlp_descs, lambda: reference("mlp"), mlp_batch, [_ce]
    return deep_descs, lambda: reference("deep"), mlp_batch, [_ce]


def _micro(value, n):
    """Paddle's list form: a tensor as its n micro-batches, a tuple element-wise."""
    if isinstance(value, tuple):
        return tuple(_micro(v, n) for v in value)
    return list(value.chunk(n))


def _call(ref, x):
    return ref(*(x if isinstance(x, tuple) else (x,)))


def _rows(value, i, n):
    if isinstance(value, tuple):
        return tuple(_rows(v, i, n) for v in value)
    return value.chunk(n)[i]


def _train(rank, world, kind, pp, acc, virtual=None, mode="1F1B", seg="uniform", steps=3, form="tensor",
           two_losses=False, loss_fn_idx=0, ckpt=None):
    """Train ``steps`` train_batch calls against the reference; every rank's worst differences."""
    descs, make_ref, batch, fns = _model(kind)
    if two_losses:
        fns = [_ce, _square]
    dp = world // pp
    ref = make_ref()
    torch.manual_seed(1 + rank)  # stages build from other seeds: the copy must set every weight
    stage = PipelineLayer(descs(), num_stages=pp, loss_fn=fns if len(fns) > 1 else fns[0], seg_method=seg,
                          num_virtual_pipeline_stages=virtual)
    copy_from(stage, ref)
    model = PipelineParallel(stage, accumulate_steps=acc, micro_batch_size=ROWS // acc, schedule=mode)
    # a stage of parameter-free layers only (pp4 x 2 over deep_descs: the Tanh) steps an optimizer of nothing
    opt = torch.optim.AdamW(list(model.parameters()) or [nn.Parameter(torch.zeros(1))], lr=0.05)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    d_loss, d_micro = [], []
    for step in range(steps):
        shards = [batch(step, ROWS, r) for r in range(dp)]
        x, y = shards[rank // pp]
        data = [_micro(x, acc), _micro(y, acc)] if form == "list" else [x, y]
        out = model.train_batch(data, opt, loss_fn_idx=loss_fn_idx, return_micro_batch_loss=step == 1)
        # the reference: every loss function on every micro-batch, the chosen one's mean differentiated
        table = [[[fn(_call(ref, _rows(xs, i, acc)), _rows(ys, i, acc)) for i in range(acc)] for fn in fns]
                 for xs, ys in shards]
        ref_opt.zero_grad()
        torch.stack([mb for replica in table for mb in replica[loss_fn_idx]]).mean().backward()
        ref_opt.step()
        mine = [torch.stack(per).detach() for per in table[rank // pp]]  # per loss function, (acc,)
        got = out if isinstance(out, list) else [out]
        assert len(got) == len(fns)
        for g, m in zip(got, mine):
            if step == 1:  # Paddle's micro-batch losses: each divided by accumulate_steps
                assert g.shape == (acc,)
                d_micro.append(max_abs_diff(g, m / acc if acc > 1 else m))
            else:
                d_loss.append(max_abs_diff(g, m.mean()))
    x, y = batch(steps, ROWS, 0)
    with torch.no_grad():
        ref_eval = [torch.stack([fn(_call(ref, _rows(x, i, acc)), _rows(y, i, acc)) for i in range(acc)]).mean()
                    for fn in fns]
    ev = model.eval_batch([x, y], compute_loss=True)
    result = {"loss": worst(d_loss), "micro": worst(d_micro), "param": max_abs_diff(stage.state_dict(),
                                                                                     ref.state_dict()),
              "eval": max_abs_diff(ev if isinstance(ev, list) else [ev], ref_eval),
              "names": sorted(stage.state_dict()), "chunks": [sorted(dict(c.named_parameters()))
                                                               for c in (stage.get_model_chunks() or [])]}
    if ckpt is not None:
        result.update(_checkpoints(model, stage, ref, descs, pp, ckpt))
    return result


def _checkpoints(model, stage, ref, descs, pp, path):
    """Full state = the reference's state; a full state loads back; a DCP checkpoint of the interleaved stage
    loads into a one-chunk pipeline of the same model (other layers per rank), equal to the reference."""
    import torch.distributed.checkpoint as dcp

    full = model.full_state_dict()
    d_full = max_abs_diff(full, ref.state_dict())
    same_keys = sorted(full) == sorted(ref.state_dict())
    shifted = {k: v + 0.5 for k, v in ref.state_dict().items()}
    model.load_full_state_dict(shifted)
    d_loaded = max_abs_diff(stage.state_dict(), shifted)
    model.load_full_state_dict(ref.state_dict())
    dcp.save(dcp_state(stage, writing=True), checkpoint_id=path)
    td.barrier()
    torch.manual_seed(7)
    other = PipelineLayer(descs(), num_stages=pp, loss_fn=_ce)  # one chunk per stage: other layers here
    state = dcp_state(other)
    dcp.load(state, checkpoint_id=path)
    load_dcp_state(other, None, state)
    return {"full": d_full, "keys": same_keys, "loaded": d_loaded,
            "dcp": max_abs_diff(other.state_dict(), ref.state_dict())}


def _ok(results, keys=("loss", "param", "eval")):
    for r in results:
        for k in keys:
            assert r[k] < TOL, (k, results)



def _cases(world, tmp):
    """Every pipeline run of this file on ``world`` ranks without fleet, by name: (function, args, kwargs)."""
    if world == 4:
        return {"vpp_dp2": (_train, ("deep", 2, 2, 2, "VPP"), {}), "pp4_v2": (_train, ("deep", 4, 4, 2, "VPP"), {})}
    cases = {("vpp", mode): (_train, ("deep", 2, 4, 2, mode), {"ckpt": f"{tmp}/{mode}"}) for mode in ("VPP", "FThenB")}
    cases["tied_tail"] = (_train, ("tied_tail", 2, 2, 2, "1F1B", [0, 1, 2, 3]), {})
    cases["seg_list"] = (_train, ("mlp", 2, 4, None, "1F1B", [0, 1]), {})
    for virtual in (None, 2):
        cases[("one_micro", virtual)] = (_train, ("deep", 2, 1, virtual, "1F1B"), {})
        cases[("amp", virtual)] = (_amp, (virtual,), {})
    for kind in ("mlp", "tied_tail"):
        seg = [0, 2] if kind == "tied_tail" else "uniform"
        cases[("list", kind)] = (_train, (kind, 2, 4, None, "1F1B", seg), {"form": "list"})
    for idx in (0, 1):
        cases[("loss_fn_idx", idx)] = (_train, ("mlp", 2, 4), {"two_losses": True, "loss_fn_idx": idx})
    return cases


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(world, name)``: each rank's result of the case ``name`` of ``_cases(world)``; the cases of a world size
    run in one launch for the module."""
    launched = {}

    def get(world, name):
        if world not in launched:
            tmp = str(tmp_path_factory.mktemp(f"pipeline{world}"))
            launched[world] = run_ranks(run_cases, world_size=world, args=(_cases(world, tmp),), timeout=600)
        return [out[name] for out in launched[world]]

    return get

# -- interleaved schedules -----------------------------------------------------------------------------------------
@pytest.mark.timeout(700)
@pytest.mark.parametrize("mode", ["VPP", "FThenB"])
def test_interleaved_pp2_v2_equals_single_process(mode, runs):
    results = runs(2, ("vpp", mode))
    _ok(results, ("loss", "micro", "param", "eval", "full", "loaded", "dcp"))
    assert all(r["keys"] for r in results)
    # Paddle's interleave: 8 layers in 4 chunks of 2; chunks 0 and 2 on stage 0, 1 and 3 on stage 1, named by
    # global layer index
    assert results[0]["names"] == ["0.bias", "0.weight", "4.bias", "4.weight"]
    assert results[1]["names"] == ["2.bias", "2.weight", "6.bias", "6.weight"]
    assert results[0]["chunks"] == [["0.bias", "0.weight"], ["4.bias", "4.weight"]]


@pytest.mark.timeout(700)
def test_interleaved_tied_layer_in_two_chunks_of_one_stage(runs):
    """The embedding (chunk 0) and its tied head (chunk 2) on stage 0: one weight, its gradient from both."""
    results = runs(2, "tied_tail")
    _ok(results)
    assert results[0]["names"] == ["shared_layers.embed.word_embeddings.weight"]
    assert results[1]["names"] == ["1.fc.bias", "1.fc.weight", "3.alpha"]


@pytest.mark.timeout(700)
def test_interleaved_pp2_v2_with_data_parallel(runs):
    results = runs(4, "vpp_dp2")
    _ok(results)


def _fleet_vpp(rank, world, clip):
    """Paddle's workflow: strategy schedule_mode "VPP", PipelineLayer(topology=hcg.topology(),
    num_virtual_pipeline_stages=2), fleet.distributed_model / distributed_optimizer (its hybrid clip); the tied
    embedding (chunk 0, stage 0) and head (chunk 3, stage 1)."""
    hcg = init_fleet({"dp_degree": 1, "mp_degree": 1, "pp_degree": 2},
                     {"accumulate_steps": 4, "micro_batch_size": 2, "schedule_mode": "VPP"})
    ref = reference("tied")
    stage = PipelineLayer(tied_descs(), topology=hcg.topology(), loss_fn=tied_loss, num_virtual_pipeline_stages=2)
    copy_from(stage, ref)
    model = fleet.distributed_model(stage)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    inner._grad_clip = ClipGradByGlobalNorm(clip)
    opt = fleet.distributed_optimizer(inner)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    d_loss = []
    for step in range(4):
        x, y = tied_batch(step, ROWS, 0)
        loss = model.train_batch([x, y], opt)
        ref_loss = torch.stack([tied_loss(ref(*_rows(x, i, 4)), _rows(y, i, 4)) for i in range(4)]).mean()
        ref_opt.zero_grad()
        ref_loss.backward()
        assert torch.nn.utils.clip_grad_norm_(ref.parameters(), clip) > 2 * clip  # the clip does act
        ref_opt.step()
        d_loss.append(max_abs_diff(loss, ref_loss.detach()))
    return {"loss": worst(d_loss), "param": max_abs_diff(stage.state_dict(), ref.state_dict()),
            "eval": 0.0, "names": sorted(stage.state_dict())}


def test_fleet_vpp_tied_layers_with_hybrid_clip():
    results = run_ranks(_fleet_vpp, world_size=2, args=(0.05,), timeout=180)
    _ok(results)
    assert results[0]["names"] == ["2.fc.bias", "2.fc.weight", "shared_layers.embed.word_embeddings.weight"]


# -- fewer micro-batches than stages -------------------------------------------------------------------------------
@pytest.mark.timeout(700)
@pytest.mark.parametrize("virtual", [None, 2])
def test_one_micro_batch_on_pp2(virtual, runs):
    """accumulate_steps=1 on pp2 (torch's Schedule1F1B refuses it; Paddle's 1F1B runs it)."""
    results = runs(2, ("one_micro", virtual))
    _ok(results, ("loss", "micro", "param", "eval"))


# -- seg_method as boundaries --------------------------------------------------------------------------------------
@pytest.mark.timeout(700)
def test_seg_method_list_of_boundaries(runs):
    descs = mlp_descs()
    assert SegmentLayers(descs, 2, [0, 1]).do_segment() == [0, 1, 5]  # Paddle: the end may be left out
    assert SegmentLayers(descs, 2, [0, 3, 5]).do_segment() == [0, 3, 5]
    assert SegmentLayers(descs, 2, [0, 1, 2, 4], num_virtual_pipeline_stage=2).do_segment() == [0, 1, 2, 4, 5]
    for bad in ([1, 3, 5], [0, 3, 3, 5], [0, 6], [0, 2, 4, 5]):
        with pytest.raises(ValueError, match="increasing layer boundaries") as err:
            SegmentLayers(descs, 2, bad).do_segment()
        assert "\n" not in str(err.value)
    results = runs(2, "seg_list")
    _ok(results)
    assert results[0]["names"] == ["0.bias", "0.weight"]
    assert results[1]["names"] == ["2.bias", "2.weight", "4.bias", "4.weight"]


# -- micro-batches as a list; several loss functions ---------------------------------------------------------------
@pytest.mark.timeout(700)
@pytest.mark.parametrize("kind", ["mlp", "tied_tail"])
def test_micro_batches_given_as_a_list(kind, runs):
    results = runs(2, ("list", kind))
    _ok(results, ("loss", "micro", "param", "eval"))


@pytest.mark.timeout(700)
@pytest.mark.parametrize("loss_fn_idx", [0, 1])
def test_loss_fn_list_with_loss_fn_idx_and_micro_batch_losses(loss_fn_idx, runs):
    results = runs(2, ("loss_fn_idx", loss_fn_idx))
    _ok(results, ("loss", "micro", "param", "eval"))


def _bad_calls(rank, world):
    stage = PipelineLayer(mlp_descs(), num_stages=2, loss_fn=[_ce, _square])
    model = PipelineParallel(stage, accumulate_steps=2, micro_batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = mlp_batch(0)
    msgs = []
    for call in (lambda: model.train_batch([x, y], opt, loss_fn_idx=2),
                 lambda: model.train_batch([list(x.chunk(4)), y], opt),
                 lambda: PipelineParallel(stage, accumulate_steps=2, micro_batch_size=4, schedule="VPP"),
                 lambda: PipelineLayer(mlp_descs(), num_stages=2, num_virtual_pipeline_stages=3),
                 lambda: PipelineLayer(deep_descs(), num_stages=2, num_virtual_pipeline_stages=2).forward(x),
                 lambda: PipelineParallel(PipelineLayer(deep_descs(), num_stages=2, loss_fn=_ce,
                                                        num_virtual_pipeline_stages=2), accumulate_steps=5)):
        try:
            call()
            msgs.append(None)
        except ValueError as e:
            msgs.append(str(e))
    return msgs


def test_bad_pipeline_calls_fail_with_one_line():
    for msgs in run_ranks(_bad_calls, world_size=2, timeout=120):
        idx, listed, vpp, chunks, forward, rounds = msgs
        assert "loss_fn_idx=2 names no loss function" in idx
        assert "a list of 4 but accumulate_steps is 2" in listed
        assert "num_virtual_pipeline_stages > 1" in vpp
        assert "5 layer(s) for 2 stages x 3 virtual" in chunks
        assert "chunk_id=i" in forward
        assert "accumulate_steps=5 does not fit the 1F1B schedule over 2 stages" in rounds
        assert not any("\n" in m for m in msgs)


# -- float16 amp (Paddle's hybrid_parallel_pp_amp) -----------------------------------------------------------------
def _amp(rank, world, virtual):
    ref = reference("deep")
    stage = PipelineLayer(deep_descs(), num_stages=2, loss_fn=_ce, num_virtual_pipeline_stages=virtual)
    copy_from(stage, ref)
    model = PipelineParallel(stage, accumulate_steps=4, micro_batch_size=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt._grad_clip = ClipGradByGlobalNorm(1.0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    scaler = fleet.distributed_scaler(torch.amp.GradScaler("cpu", init_scale=2.0**5))
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**5)
    rel, d_param = [], []
    x, y = mlp_batch(0, ROWS, 0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        half = _ce(ref(x), y).float()
    with torch.no_grad():
        effect = (half - _ce(ref(x), y)).abs()  # autocast does change the result: the test sees float16 run
    for step in range(5):
        x, y = mlp_batch(step, ROWS, 0)
        with torch.autocast("cpu", dtype=torch.float16):
            loss_a = _ce(ref(x), y)
        ref_scaler.scale(loss_a).backward()
        ref_scaler.unscale_(ref_opt)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        ref_opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss_b = model.train_batch([x, y], opt, scaler=scaler)
        rel.append(((loss_b - loss_a.float()).abs() / loss_a.float().abs()).detach())
        d_param.append(max_abs_diff(stage.state_dict(), ref.state_dict()))
    return {"rel": worst(rel), "param": worst(d_param), "effect": float(effect)}


@pytest.mark.timeout(700)
@pytest.mark.parametrize("virtual", [None, 2])
def test_fp16_amp_within_paddles_tolerance(virtual, runs):
    for r in runs(2, ("amp", virtual)):
        assert r["rel"] < 5e-5, r  # Paddle's assert_allclose(loss_a, loss_b, rtol=5e-5)
        assert r["param"] < 1e-3 and r["effect"] > 1e-5, r


@pytest.mark.timeout(700)
def test_interleaved_pp4_v2_one_layer_chunks(runs):
    """pp4 x 2 virtual stages over eight layers: one layer a chunk, some without parameters (the Tanh)."""
    results = runs(4, "pp4_v2")
    _ok(results, ("loss", "micro", "param", "eval"))
    assert results[1]["names"] == [] and results[0]["names"] == ["0.bias", "0.weight", "4.bias", "4.weight"]
