"""Pipelines through Paddle's workflow: hybrid_configs pp_degree, fleet.init, get_hybrid_communicate_group,
PipelineLayer(topology=hcg.topology()), fleet.distributed_model -> PipelineParallel, fleet.distributed_optimizer.

A port of Paddle's test/collective/fleet/hybrid_parallel_shared_weight.py: embedding and output head tied across
two stages, inputs ``(x1, x2)`` and labels ``(y1,)``, SGD with a stepped learning rate: every step's loss equals
the single-process model's (Paddle asserts the same), here also the parameters, and with dp=2 x pp=2 on 4 ranks.
"""

import pytest
import torch
from hybrid_models import copy_from, init_fleet, reference, run_cases, tied_batch, tied_descs, tied_loss
from parity import max_abs_diff, worst

from fleetlite.distributed import fleet
from fleetlite.distributed.fleet.meta_parallel import PipelineLayer, PipelineParallel
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

BATCH, MICRO, STEPS = 8, 2, 5


def _fleet_shared_weight(rank, world, dp, schedule_mode, clip=None):
    hcg = init_fleet({"dp_degree": dp, "mp_degree": 1, "pp_degree": world // dp},
                     {"accumulate_steps": BATCH // MICRO, "micro_batch_size": MICRO, "schedule_mode": schedule_mode})
    ref = reference("tied")
    stage = PipelineLayer(tied_descs(), topology=hcg.topology(), loss_fn=tied_loss)
    copy_from(stage, ref)
    model = fleet.distributed_model(stage)
    assert isinstance(model, PipelineParallel) and model.stage_id == hcg.get_stage_id()
    assert list(model.state_dict()) == list(stage.state_dict())  # keys by global layer index, as Paddle's
    assert len(list(model.parameters())) == len(list(stage.parameters()))
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    if clip is not None:
        inner._grad_clip = ClipGradByGlobalNorm(clip)  # Paddle's grad_clip=, read by fleet's optimizer
    opt = fleet.distributed_optimizer(inner)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt.inner_opt, milestones=[2, 3, 4], gamma=2.0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01)
    ref_sched = torch.optim.lr_scheduler.MultiStepLR(ref_opt, milestones=[2, 3, 4], gamma=2.0)
    d_loss = []
    for step in range(STEPS):
        shards = [tied_batch(step, BATCH, d) for d in range(dp)]
        x, y = shards[hcg.get_data_parallel_rank()]
        loss_b = model.train_batch([x, y], opt, sched)
        losses = [tied_loss(ref(*xs), ys) for xs, ys in shards]
        ref_opt.zero_grad()
        torch.stack(losses).mean().backward()
        if clip is not None:
            assert torch.nn.utils.clip_grad_norm_(ref.parameters(), clip) > 2 * clip  # the clip does act
        ref_opt.step()
        ref_sched.step()
        d_loss.append(abs(loss_b.item() - losses[hcg.get_data_parallel_rank()].item()))
    ref_state = ref.state_dict()
    d_param = max_abs_diff(stage.state_dict(), ref_state)
    # pp 2 -> 1: the stages' state dicts (keys by global layer index) merge into the whole model's
    parts = [None] * world
    torch.distributed.all_gather_object(parts, model.state_dict())
    merged = {k: v for part in parts for k, v in part.items()}
    whole = PipelineLayer(tied_descs(), num_stages=1, loss_fn=tied_loss)
    whole.load_state_dict(merged)  # strict: every key present, none extra
    d_merged = max_abs_diff(whole.state_dict(), ref_state)
    return worst(d_loss), worst([d_param, d_merged]), opt.get_lr()


@pytest.fixture(scope="module")
def pp2():
    """Every rank's results of both pp2 runs of this file, without a clip and with fleet's hybrid clip (keys None
    and 0.05): one 2-rank launch for the module."""
    cases = {clip: (_fleet_shared_weight, (1, "1F1B", clip), {}) for clip in (None, 0.05)}
    return run_ranks(run_cases, world_size=2, args=(cases,), timeout=300)


@pytest.mark.timeout(400)
def test_shared_weight_pp2_as_paddle(pp2):
    for d_loss, d_param, lr in (out[None] for out in pp2):
        assert d_loss < 1e-5 and d_param < 1e-5
        assert abs(lr - 0.08) < 1e-12  # the scheduler stepped once per train_batch


def test_shared_weight_dp2_pp2_fthenb():
    for d_loss, d_param, _ in run_ranks(_fleet_shared_weight, world_size=4, args=(2, "FThenB"), timeout=240):
        assert d_loss < 1e-5 and d_param < 1e-5


@pytest.mark.timeout(400)
def test_fleet_optimizer_grad_clip_counts_shared_weight_once(pp2):
    """fleet.distributed_optimizer's hybrid clip: the tied embedding, held by both stages, counts once."""
    for d_loss, d_param, _ in (out[0.05] for out in pp2):
        assert d_loss < 1e-5 and d_param < 1e-5


def _bad_fleet_configs(rank, world):
    from torch import nn

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}
    strategy.recompute = True
    strategy.recompute_configs = {"checkpoints": ["9"]}
    fleet.init(is_collective=True, strategy=strategy)
    msgs = []
    for num_stages in (2, 1):  # a checkpoint no stage holds; a one-stage layer under pp_degree 2 refused
        layer = PipelineLayer([nn.Linear(2, 2), nn.Linear(2, 2)], num_stages=num_stages, loss_fn=nn.MSELoss())
        try:
            fleet.distributed_model(layer)
        except (ValueError, NotImplementedError, KeyError) as e:
            msgs.append(str(e))
        strategy.recompute = False
        fleet.init(is_collective=True, strategy=strategy)
    return msgs


def test_bad_pipeline_configs_fail_with_one_line():
    for recompute_msg, stages_msg in run_ranks(_bad_fleet_configs, world_size=2, timeout=60):
        # strategy amp/recompute/sync_batch_norm run with a PipelineLayer (test_pipeline_strategy.py)
        assert "['9'] name no submodule of any pipeline stage" in recompute_msg and "\n" not in recompute_msg
        assert "1 stages but hybrid_configs['pp_degree'] is 2" in stages_msg and "\n" not in stages_msg
