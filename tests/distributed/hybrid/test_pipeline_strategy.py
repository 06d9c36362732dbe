"""Strategy amp, recompute and sync_batch_norm with a PipelineLayer (Note [pipeline strategies]): each against a
single process of the same model from the same weights, fed the same micro-batches.

- amp bfloat16: the reference runs each micro-batch under ``torch.autocast(bfloat16)``, loss in float32; the
  same ops in the same dtypes on both sides (a stage boundary's float32 cast is exact), so the float32 bound,
  1e-5, holds (measured: equal); against a float32 run the pipeline differs by ~1e-3 (autocast really ran);
- amp float16: loss scaling through the DistributedOptimizer's scaler against torch's GradScaler (same
  initial scale), 1e-5 (measured: equal); an inf seen by one stage only makes every stage skip the step;
- recompute and sync_batch_norm: float32, 1e-5.
"""

import warnings

import pytest
import torch
from hybrid_models import copy_from, init_fleet, mlp_batch, mlp_descs, reference, run_cases
from parity import max_abs_diff, worst
from torch import nn

from fleetlite.distributed import fleet
from fleetlite.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer, SharedLayerDesc
from fleetlite.distributed.fleet.recompute import is_recomputed
from fleetlite.nn import SyncBatchNorm
from fleetlite.testing import run_ranks

N_MB, MB, STEPS = 4, 2, 4
CE = nn.CrossEntropyLoss()


def _setup(rank, world, kind, dp=1, **fields):
    """``kind``: "mlp" or "bn" (a stage from their descriptions, its weights copied from the plain torch
    reference, returned as ``ref``), or a list of layer descriptions (no reference)."""
    descs = {"mlp": mlp_descs, "bn": bn_descs}[kind]() if isinstance(kind, str) else kind
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # amp on a CPU
        hcg = init_fleet({"dp_degree": dp, "pp_degree": world // dp},
                         {"accumulate_steps": N_MB, "micro_batch_size": MB}, **fields)
        ref = {"mlp": lambda: reference("mlp"), "bn": _bn_reference}[kind]() if isinstance(kind, str) else None
        stage = PipelineLayer(descs, topology=hcg.topology(), loss_fn=CE)
        if ref is not None:
            copy_from(stage, ref)
        model = fleet.distributed_model(stage)
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    return hcg, ref, stage, model, opt


def _ref_step(ref, ref_opt, x, y, dtype=None, scaler=None):
    """One step of the single-process model over the same micro-batches: mean of the micro-batch losses."""
    losses = []
    for xm, ym in zip(x.split(MB), y.split(MB)):
        if dtype is None:
            out = ref(xm)
        else:
            with torch.autocast("cpu", dtype=dtype):
                out = ref(xm)
        loss = CE(out.float(), ym)
        losses.append(loss.detach())
        (scaler.scale(loss / N_MB) if scaler is not None else loss / N_MB).backward()
    if scaler is not None:
        scaler.step(ref_opt)
        scaler.update()
    else:
        ref_opt.step()
    ref_opt.zero_grad()
    return torch.stack(losses).mean()


def _max_diff(stage, ref):
    return max_abs_diff(stage.state_dict(), ref.state_dict())


def _amp_bf16(rank, world):
    hcg, ref, stage, model, opt = _setup(rank, world, "mlp", amp=True, amp_configs={"dtype": "bfloat16"})
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    fp32 = reference("mlp")  # the same model without autocast: amp must make a difference
    fp32_opt = torch.optim.AdamW(fp32.parameters(), lr=1e-2)
    d_loss, dtypes = [], set()
    hook = stage.run_function[0].register_forward_hook(lambda m, i, o: dtypes.add(o.dtype))
    for step in range(STEPS):
        x, y = mlp_batch(step, N_MB * MB)
        loss = model.train_batch([x, y], opt)
        d_loss.append(abs(loss.item() - _ref_step(ref, ref_opt, x, y, torch.bfloat16).item()))
        _ref_step(fp32, fp32_opt, x, y)
    hook.remove()
    return dict(loss=worst(d_loss), param=_max_diff(stage, ref), vs_fp32=_max_diff(stage, fp32), dtypes=dtypes)


@pytest.fixture(scope="module")
def pp2():
    """Every rank's results of the pp2 runs of this file that end normally, by name: one 2-rank launch for the
    module."""
    cases = {"bf16": (_amp_bf16, (), {}), "fp16": (_amp_fp16, (), {}), "recompute": (_recompute, (["0", "4"],), {})}
    return run_ranks(run_cases, world_size=2, args=(cases,), timeout=300)


@pytest.mark.timeout(400)
def test_amp_bfloat16_pipeline_follows_a_single_process_under_autocast(pp2):
    for r in (out["bf16"] for out in pp2):
        assert r["loss"] <= 1e-5 and r["param"] <= 1e-5, r
        assert r["vs_fp32"] > 100 * max(r["param"], 1e-6), r  # autocast really ran
        assert r["dtypes"] == {torch.bfloat16}, r


def _amp_fp16(rank, world):
    hcg, ref, stage, model, opt = _setup(rank, world, "mlp", amp=True,
                                         amp_configs={"dtype": "float16", "init_loss_scaling": 1024.0})
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    d_loss, dtypes = [], set()
    hook = stage.run_function[0].register_forward_hook(lambda m, i, o: dtypes.add(o.dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(STEPS):
            x, y = mlp_batch(step, N_MB * MB)
            loss = model.train_batch([x, y], opt)
            d_loss.append(abs(loss.item() - _ref_step(ref, ref_opt, x, y, torch.float16, scaler).item()))
        hook.remove()
        try:
            model.train_batch([x, y], opt, scaler=fleet.distributed_scaler(torch.amp.GradScaler("cpu")))
            passed_scaler = "accepted"
        except ValueError as e:
            passed_scaler = str(e)
        # an inf on stage 0 only: both stages skip the step (the skip decision is agreed by every rank)
        before = {k: v.clone() for k, v in stage.state_dict().items()}
        first = next(stage.parameters())
        handle = first.register_hook(lambda g: torch.full_like(g, float("inf"))) if rank == 0 else None
        model.train_batch([x, y], opt)
        if handle is not None:
            handle.remove()
        unchanged = all(torch.equal(before[k], v) for k, v in stage.state_dict().items())
    return dict(loss=worst(d_loss), param=_max_diff(stage, ref), scale=opt.amp.scaler.get_scale(),
                ref_scale=scaler.get_scale(), passed_scaler=passed_scaler, skipped=not opt.stepped,
                found_inf=opt.amp.scaler.last_found_inf, unchanged=unchanged, dtypes=dtypes)


@pytest.mark.timeout(400)
def test_amp_float16_pipeline_scales_the_loss_and_skips_on_every_stage(pp2):
    for r in (out["fp16"] for out in pp2):
        assert r["loss"] <= 1e-5 and r["param"] <= 1e-5 and r["scale"] == r["ref_scale"] == 1024.0, r
        assert "scales the loss itself; drop scaler=" in r["passed_scaler"], r
        assert r["skipped"] and r["found_inf"] and r["unchanged"], r
        assert r["dtypes"] == {torch.float16}, r  # autocast float16 really ran


def _recompute(rank, world, checkpoints):
    hcg, ref, stage, model, opt = _setup(rank, world, "mlp", recompute=True,
                                         recompute_configs={"checkpoints": checkpoints})
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    d_loss = []
    for step in range(STEPS):
        x, y = mlp_batch(step, N_MB * MB)
        loss = model.train_batch([x, y], opt)
        d_loss.append(abs(loss.item() - _ref_step(ref, ref_opt, x, y).item()))
    return dict(loss=worst(d_loss), param=_max_diff(stage, ref),
                recomputed=sorted(n for n, m in stage.named_modules() if n and is_recomputed(m)))


@pytest.mark.timeout(400)
def test_recompute_checkpoints_inside_pipeline_stages(pp2):
    # 5 layers on 2 stages: "0", "1" on stage 0; "2", "3", "4" on stage 1
    out = [r["recompute"] for r in pp2]
    for r in out:
        assert r["loss"] <= 1e-5 and r["param"] <= 1e-5, r
    assert out[0]["recomputed"] == ["0"] and out[1]["recomputed"] == ["4"]


def test_recompute_checkpoint_no_stage_holds_fails_on_every_stage():
    out = run_ranks(_recompute, world_size=2, args=(["0", "7"],), expect_failure=True, timeout=120)
    for kind, text in out.values():
        assert kind == "error" and "recompute checkpoints ['7'] name no submodule of any pipeline stage" in text, text


def bn_descs():  # no bias before the batch norm: its gradient is ~0 noise that AdamW would turn into steps
    return [LayerDesc(nn.Linear, 6, 12, bias=False), LayerDesc(nn.BatchNorm1d, 12), nn.Tanh(),
            LayerDesc(nn.Linear, 12, 4)]


def _bn_reference():
    """``bn_descs`` as a plain torch model (the stages' parameter and buffer names)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12, bias=False), nn.BatchNorm1d(12), nn.Tanh(), nn.Linear(12, 4))


def _sync_bn(rank, world):
    hcg, ref, stage, model, opt = _setup(rank, world, "bn", dp=2, sync_batch_norm=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    dp_rank = hcg.get_data_parallel_rank()
    d_loss = []
    for step in range(STEPS):
        shards = [mlp_batch(step, N_MB * MB, d) for d in range(2)]
        loss = model.train_batch(list(shards[dp_rank]), opt)
        # the single process: micro-batch i of every replica normalised together (statistics per micro-batch)
        losses = []
        for i in range(N_MB):
            rows = [(x.split(MB)[i], y.split(MB)[i]) for x, y in shards]
            out = ref(torch.cat([x for x, _ in rows]))
            parts = out.split(MB)
            losses.append(torch.stack([CE(o, y) for o, (_, y) in zip(parts, rows)]))  # [replica]
            (losses[-1].mean() / N_MB).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        d_loss.append(abs(loss.item() - torch.stack(losses)[:, dp_rank].mean().item()))
    bns = [m for m in stage.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return dict(loss=worst(d_loss), param=_max_diff(stage, ref), stage=hcg.get_stage_id(),
                sync=[isinstance(m, SyncBatchNorm) and m in stage.run_function for m in bns])


@pytest.mark.timeout(300)
def test_sync_batch_norm_in_a_pipeline_stage_dp2_pp2_on_four_ranks():
    for r in run_ranks(_sync_bn, world_size=4, timeout=290):
        assert r["loss"] <= 1e-5 and r["param"] <= 1e-5, r  # parameters and running statistics
        assert r["sync"] == ([True] if r["stage"] == 0 else []), r


def _shared_bn(rank, world):
    descs = [LayerDesc(nn.Linear, 6, 12), SharedLayerDesc("bn", nn.BatchNorm1d, None, "weight", 12), nn.Tanh(),
             LayerDesc(nn.Linear, 12, 12), SharedLayerDesc("bn", nn.BatchNorm1d, None, "weight", 12),
             LayerDesc(nn.Linear, 12, 4)]
    _setup(rank, world, descs, sync_batch_norm=True)


def test_sync_batch_norm_in_a_shared_layer_is_refused_on_every_stage():
    for kind, text in run_ranks(_shared_bn, world_size=2, expect_failure=True, timeout=120).values():
        assert kind == "error" and "batch norm inside a SharedLayerDesc layer" in text, text
