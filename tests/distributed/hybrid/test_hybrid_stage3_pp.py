"""Sharding stage 3 (FSDP2) beside pipelines (Note [stage 3 beside pp]): pp2 × sharding2 on 4 ranks, each stage
``fully_shard``-ed over the two ranks holding it, trains like a hand-written single-process model from the same
full weights on the global batch (AdamW, global-norm clipping of the whole model through Paddle's
``optimizer._grad_clip``, with and without ``fleet.distributed_optimizer``), every rank's shards checked against the
reference's; the full state gathers to the single-process model's state and loads back into the shards."""

import pytest
import torch
import torch.distributed as tdist
from hybrid_models import copy_from, init_fleet, mlp_batch, mlp_descs, reference, tied_descs, tied_loss
from parity import max_abs_diff, worst
from torch import nn

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet.meta_parallel import PipelineLayer, PipelineParallel
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

STEPS, ROWS, MICRO, CLIP, TOL = 4, 4, 2, 0.05, 1e-5


def _shard_of(full, hcg):
    """FSDP2's dim-0 chunk of ``full`` for this data × sharding rank (torch.chunk's sizes, empty past the last)."""
    n, r = hcg.get_data_sharding_parallel_world_size(), hcg.get_data_sharding_parallel_rank()
    chunks = list(full.chunk(n, dim=0))
    return (chunks + [full[:0]] * n)[r]


def _shard_diff(stage, ref, hcg):
    """How far this rank's shards are from the reference's (every parameter must be a sharded DTensor)."""
    ref_params = dict(ref.named_parameters())
    out = []
    for name, p in stage.named_parameters():
        assert hasattr(p, "to_local") and p.to_local().numel() < p.numel(), (name, type(p))
        out.append(max_abs_diff(p.to_local(), _shard_of(ref_params[name].detach(), hcg)))
    return worst(out)


def _pp2_stage3(rank, world, fleet_optimizer):
    hcg = init_fleet({"dp_degree": 1, "pp_degree": 2, "sharding_degree": 2},
                     {"accumulate_steps": ROWS // MICRO, "micro_batch_size": MICRO}, sharding=True,
                     sharding_configs={"stage": 3})
    ref = reference("mlp")
    torch.manual_seed(1 + rank)  # stages build from different seeds: the copy below must set every weight
    stage = PipelineLayer(mlp_descs(), topology=hcg.topology(), loss_fn=nn.CrossEntropyLoss())
    copy_from(stage, ref)
    model = fleet.distributed_model(stage)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inner._grad_clip = ClipGradByGlobalNorm(CLIP)
    opt = fleet.distributed_optimizer(inner) if fleet_optimizer else inner
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    part, parts = hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()
    d_loss, clipped = [], True
    for step in range(STEPS):
        shards = [mlp_batch(step, ROWS, d) for d in range(parts)]
        x, y = shards[part]
        loss = model.train_batch([x, y], opt)
        losses = [nn.functional.cross_entropy(ref(xs), ys) for xs, ys in shards]
        ref_opt.zero_grad()
        torch.stack(losses).mean().backward()
        clipped &= bool(torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP) > 2 * CLIP)  # the clip acts
        ref_opt.step()
        d_loss.append(abs(loss.item() - losses[part].item()))
    x, y = mlp_batch(STEPS, ROWS, part)
    with torch.no_grad():
        ref_eval = nn.functional.cross_entropy(ref(x), y)
    d_eval = abs(model.eval_batch([x, y], compute_loss=True).item() - ref_eval.item())
    d_shard = _shard_diff(stage, ref, hcg)  # (after an evaluation too: the stage is sharded again)
    full = model.full_state_dict()
    d_full = max_abs_diff(full, ref.state_dict())
    keys = sorted(full) == sorted(ref.state_dict())
    torch.manual_seed(7)
    other = type(ref)()  # another single-process model: its state loads into the shards
    model.load_full_state_dict(other.state_dict())
    d_load = _shard_diff(stage, other, hcg)
    return dict(loss=worst(d_loss), eval=d_eval, shard=d_shard, full=d_full, keys=keys, load=d_load, clipped=clipped,
                is_pp=isinstance(model, PipelineParallel), stage3=model.stage3,
                data=tdist.get_process_group_ranks(hcg.get_data_sharding_parallel_group()))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fleet_optimizer", [True, False])
def test_pp2_sharding2_stage3_trains_like_a_single_process_on_four_ranks(fleet_optimizer):
    out = run_ranks(_pp2_stage3, world_size=4, args=(fleet_optimizer,), timeout=290)
    for rank, r in enumerate(out):
        assert r["loss"] <= TOL and r["eval"] <= TOL and r["shard"] <= TOL, (rank, r)
        assert r["clipped"] and r["is_pp"] and r["stage3"], (rank, r)
        assert r["full"] <= TOL and r["keys"] and r["load"] == 0.0, (rank, r)
        assert r["data"] == [rank // 2 * 2, rank // 2 * 2 + 1]  # order dp, pp, sharding: rank = 2 * pp + sharding


def _tied_stage3(rank, world):
    hcg = init_fleet({"dp_degree": 1, "pp_degree": 2, "sharding_degree": 2}, sharding=True,
                     sharding_configs={"stage": 3})
    try:
        fleet.distributed_model(PipelineLayer(tied_descs(), topology=hcg.topology(), loss_fn=tied_loss))
    except NotImplementedError as e:
        return str(e).splitlines()[0]
    return None


@pytest.mark.timeout(300)
def test_stage3_beside_pp_with_shared_layers_fails_with_one_line_on_every_rank():
    for line in run_ranks(_tied_stage3, world_size=4, timeout=290):
        assert line is not None and "shards one stage per rank without shared layers" in line, line
