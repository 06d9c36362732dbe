"""fleetlite.Trainer and fleetlite.Model fit / evaluate / predict a tensor-parallel model (mp = 2, dp x mp = 2 x 2)
exactly as one process does with the same model, weights, data and global batch: history (loss, metrics, val_*),
evaluate, predict in dataset order and the final (gathered) weights, within 1e-5; with the hybrid global-norm
clip and the per-tensor clip of a slice (the full tensor's norm)."""

import pytest
import torch
from hybrid_models import (
    N_EVAL,
    compare,
    dataset,
    full_tp_weights,
    init_fleet,
    more_predictions,
    reference_net,
    run_cases,
    run_trainer,
    stat_scores,
    tp_net,
)
from torch.utils.data import DataLoader

import fleetlite
from fleetlite.distributed import fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.io import DistributedBatchSampler
from fleetlite.testing import run_ranks

BATCH, EVAL_BATCH = 8, 8
CLIPS = {"global": {"global_clipnorm": 0.05}, "each": {"clipnorm": 0.05}}


def _reference(clip, global_batch):
    fleet_impl._reset()
    net = reference_net()
    t, out = run_trainer(net, None, global_batch, EVAL_BATCH, clip=CLIPS[clip], loss=torch.nn.CrossEntropyLoss())
    out["weights"] = {k: v.detach().clone() for k, v in net.named_parameters()}
    out["stat_scores"] = stat_scores(t)
    return out


def _tp(rank, world, degrees, clip, out_dir):
    torch.set_num_threads(1)
    init_fleet(degrees)
    strategy = fleet.user_strategy()
    net = tp_net()
    t, out = run_trainer(net, strategy, BATCH, EVAL_BATCH, clip=CLIPS[clip], loss=torch.nn.CrossEntropyLoss())
    out["weights"] = full_tp_weights(net)
    out.update(more_predictions(t, EVAL_BATCH, out_dir))
    out["loader_errors"] = _loaders(t)
    out["stat_scores"] = stat_scores(t)
    step = t.global_step
    t.compile(grad_clip=lambda params: torch.nn.utils.clip_grad_norm_(list(params), 1.0))  # a rank-local norm
    try:
        t.fit(dataset(16, 1), batch_size=BATCH, verbose=0)
        out["custom_clip"] = None
    except ValueError as e:
        out["custom_clip"] = (str(e), t.global_step == step)
    return out


def _loaders(t):
    """A DataLoader split over the data-parallel group evaluates as the Trainer's own split; one split over the
    world (Paddle's default) is refused with one line."""
    hcg = fleet.get_hybrid_communicate_group()
    ds = dataset(N_EVAL, 2)
    dp = DistributedBatchSampler(ds, EVAL_BATCH, num_replicas=hcg.get_data_sharding_parallel_world_size(),
                                 rank=hcg.get_data_sharding_parallel_rank())  # dp x sharding: dp alone without it
    out = {"dp_split": t.evaluate(DataLoader(ds, batch_sampler=dp), verbose=0)}
    try:
        t.evaluate(DataLoader(ds, batch_sampler=DistributedBatchSampler(ds, EVAL_BATCH)), verbose=0)
        out["world_split"] = None
    except ValueError as e:
        out["world_split"] = str(e)
    return out


MP2 = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 1}


@pytest.fixture(scope="module")
def mp2(tmp_path_factory):
    """Every rank's results of the mp2 runs of this file, by name (the Trainer with each clip, then Paddle's Model):
    one 2-rank launch for the module."""
    cases = {clip: (_tp, (MP2, clip, str(tmp_path_factory.mktemp(clip))), {}) for clip in CLIPS}
    cases["hapi"] = (_hapi, (), {})
    return run_ranks(run_cases, 2, args=(cases,), timeout=500)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("clip", ["global", "each"])
def test_mp2_trainer_equals_one_process(clip, mp2):
    ref = _reference(clip, BATCH)
    for out in mp2:
        r = out[clip]
        assert not compare(r, ref), compare(r, ref)
        assert r["predict"].shape[0] == N_EVAL
        _check_loaders(r, ref)


def _check_loaders(r, ref):
    assert r["custom_clip"] and "is not the model's" in r["custom_clip"][0] and r["custom_clip"][1]
    for key, v in ref["evaluate"].items():
        assert abs(r["loader_errors"]["dp_split"][key] - v) <= 1e-5, key
    assert "split over the data-parallel group" in r["loader_errors"]["world_split"]


@pytest.mark.timeout(400)
def test_dp2_mp2_trainer_equals_one_process_with_the_global_batch(tmp_path):
    ref = _reference("global", 2 * BATCH)
    for r in run_ranks(_tp, 4, args=({"dp_degree": 2, "mp_degree": 2, "pp_degree": 1}, "global", str(tmp_path)),
                       timeout=300):
        assert not compare(r, ref), compare(r, ref)
        _check_loaders(r, ref)


@pytest.mark.timeout(400)
def test_mp2_sharding2_trainer_splits_data_over_the_sharding_axis_too(tmp_path):
    """Sharding stage 1 next to mp: the sharding axis reads different data as dp does (the data group is
    dp x sharding), so 4 ranks of mp2 x sharding2 equal one process with twice the batch."""
    ref = _reference("global", 2 * BATCH)
    degrees = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 1, "sharding_degree": 2}
    for r in run_ranks(_tp, 4, args=(degrees, "global", str(tmp_path)), timeout=300):
        assert not compare(r, ref), compare(r, ref)
        _check_loaders(r, ref)


def _hapi(rank=0, world=1):
    """fleetlite.Model (Paddle's hapi): prepare, fit, evaluate with mp = 2 (or one process on the plain net)."""
    torch.set_num_threads(1)
    if world > 1:  # Paddle's order: fleet.init(strategy) first; the Model's Trainer takes that strategy
        init_fleet({"dp_degree": 1, "mp_degree": 2, "pp_degree": 1})
        net = tp_net()
    else:
        fleet_impl._reset()
        net = reference_net()
    model = fleetlite.Model(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)  # (Adam would hide a wrong clip)
    opt._grad_clip = fleetlite.trainer.clipping.ClipGradByGlobalNorm(0.05)  # Paddle's grad_clip on the optimizer
    model.prepare(opt, torch.nn.CrossEntropyLoss(), fleetlite.metric.Accuracy())
    model.fit(dataset(48, 1), dataset(N_EVAL, 2), 8, 2, verbose=0)
    out = {"evaluate": model.evaluate(dataset(N_EVAL, 2), batch_size=8, verbose=0)}
    out["weights"] = full_tp_weights(net) if world > 1 else {k: v.detach().clone() for k, v in net.named_parameters()}
    return out


@pytest.mark.timeout(600)
def test_hapi_model_fit_evaluate_mp2(mp2):
    ref = _hapi()
    for out in mp2:
        r = out["hapi"]
        assert abs(r["evaluate"]["loss"][0] - ref["evaluate"]["loss"][0]) <= 1e-5, (r["evaluate"], ref["evaluate"])
        assert abs(r["evaluate"]["acc"] - ref["evaluate"]["acc"]) <= 1e-5
        for k, w in ref["weights"].items():
            assert (r["weights"][k] - w).abs().max() <= 1e-5, k
