"""Strategy amp (bfloat16) under sharding stage 3 beside pipelines (Notes [stage 3 beside pp], [pipeline
strategies]): pp2 × sharding2 on 4 ranks against a hand-written single process that runs each data part's
micro-batches under ``torch.autocast(bfloat16)`` (loss in float32) and averages the gradients over the global batch.
The same ops in the same dtypes on both sides (FSDP2 keeps float32 parameters here; autocast casts inside each
stage, and a stage boundary's float32 cast is exact), so the float32 bound, 1e-5, holds (measured: equal); the same
single process without autocast is 1.4e-4 to 1.3e-3 away from the shards (measured), so a missing autocast fails
the bound, and every linear layer of every stage computes in bfloat16."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from parity import max_abs_diff, worst
from torch import nn

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer
from fleetlite.testing import run_ranks

IN, HIDDEN, OUT = 6, 16, 4
N_MB, MB, STEPS, TOL = 2, 2, 3, 1e-5


def _descs():
    return [LayerDesc(nn.Linear, IN, HIDDEN), LayerDesc(nn.GELU), LayerDesc(nn.Linear, HIDDEN, HIDDEN),
            LayerDesc(nn.Linear, HIDDEN, OUT)]


def _reference(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, OUT))


def _batch(step, part):
    g = torch.Generator().manual_seed(100 * step + part)
    return torch.randn(N_MB * MB, IN, generator=g), torch.randint(0, OUT, (N_MB * MB,), generator=g)


def _ref_step(ref, opt, shards, amp):
    """One step of the single process: every data part's micro-batches (under autocast with ``amp``), the
    gradient the mean over all of them; returns each part's mean loss."""
    losses = []
    for x, y in shards:
        part = []
        for xm, ym in zip(x.split(MB), y.split(MB)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                out = ref(xm)
            loss = F.cross_entropy(out.float(), ym)
            (loss / (N_MB * len(shards))).backward()
            part.append(loss.detach())
        losses.append(torch.stack(part).mean())
    opt.step()
    opt.zero_grad()
    return losses


def _shard_diff(stage, ref, hcg):
    """How far this rank's FSDP2 shards are from the reference's parameters (dim-0 chunks over data × sharding)."""
    n, r = hcg.get_data_sharding_parallel_world_size(), hcg.get_data_sharding_parallel_rank()
    ref_params = dict(ref.named_parameters())
    out = []
    for name, p in stage.named_parameters():
        assert hasattr(p, "to_local") and p.dtype == torch.float32, (name, type(p), p.dtype)
        full = ref_params[name].detach()
        out.append(max_abs_diff(p.to_local(), (list(full.chunk(n, dim=0)) + [full[:0]] * n)[r]))
    return worst(out)


def _pp2_stage3_amp(rank, world):
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy(sharding=True, sharding_configs={"stage": 3}, amp=True,
                                         amp_configs={"dtype": "bfloat16"})
    strategy.hybrid_configs = {"dp_degree": 1, "pp_degree": 2, "sharding_degree": 2}
    strategy.pipeline_configs = {"accumulate_steps": N_MB, "micro_batch_size": MB}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    ref, fp32 = _reference(), _reference()  # fp32: the same single process without autocast
    torch.manual_seed(1 + rank)
    stage = PipelineLayer(_descs(), topology=hcg.topology(), loss_fn=nn.CrossEntropyLoss())
    ref_params = dict(ref.named_parameters())
    with torch.no_grad():
        for name, p in stage.named_parameters():
            p.copy_(ref_params[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # amp on a CPU device
        model = fleet.distributed_model(stage)
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    ref_opt, fp32_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2), torch.optim.AdamW(fp32.parameters(), lr=1e-2)
    dtypes = set()
    for m in stage.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(lambda _m, _i, o: dtypes.add(o.dtype))
    part, parts = hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()
    d_loss = []
    for step in range(STEPS):
        shards = [_batch(step, d) for d in range(parts)]
        loss = model.train_batch(list(shards[part]), opt)
        d_loss.append(max_abs_diff(loss, _ref_step(ref, ref_opt, shards, amp=True)[part]))
        _ref_step(fp32, fp32_opt, shards, amp=False)
    return dict(loss=worst(d_loss), shard=_shard_diff(stage, ref, hcg), vs_fp32=_shard_diff(stage, fp32, hcg),
                dtypes=dtypes, stage3=model.stage3)


@pytest.mark.timeout(300)
def test_amp_bfloat16_under_stage3_beside_pp_follows_a_single_process_under_autocast():
    for rank, r in enumerate(run_ranks(_pp2_stage3_amp, world_size=4, timeout=290)):
        assert r["stage3"] and r["loss"] <= TOL and r["shard"] <= TOL, (rank, r)
        assert r["vs_fp32"] > 10 * TOL, (rank, r)  # without autocast the bound above fails
        assert r["dtypes"] == {torch.bfloat16}, (rank, r)
