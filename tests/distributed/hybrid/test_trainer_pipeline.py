"""fleetlite.Trainer fits / evaluates / predicts a pipeline model (pp = 2, dp x pp = 2 x 2) exactly as one process
does with the same layers, weights, data and global batch: history (the pipeline's mean loss, training metrics from
the last stage, val_*), evaluate (short last batches padded), predict in dataset order on every rank and every
stage's final weights, within 1e-5, with the hybrid global-norm clip. Bad configurations fail before any step."""

import pytest
import torch
from hybrid_models import (
    N_EVAL,
    N_TRAIN,
    all_stage_weights,
    compare,
    dataset,
    init_fleet,
    more_predictions,
    pipeline_stage,
    reference_net,
    run_trainer,
)
from torch import nn

from fleetlite.distributed import fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.testing import run_ranks

PIPE = {"accumulate_steps": 2, "micro_batch_size": 4}
ROWS = 8  # accumulate_steps * micro_batch_size: the per-rank batch
CLIP = {"global_clipnorm": 0.05}


def _reference(global_batch):
    fleet_impl._reset()
    net = reference_net()
    t, out = run_trainer(net, None, global_batch, ROWS, clip=CLIP, loss=nn.CrossEntropyLoss())
    out["evaluate_small"] = t.evaluate(dataset(N_EVAL, 2), batch_size=3, verbose=0)
    out["weights"] = {k: v.detach().clone() for k, v in net.state_dict().items()}
    return out


def _errors(t) -> dict:
    """The one-line errors of what a pipeline cannot run, raised before any step."""
    train, test = dataset(N_TRAIN, 1), dataset(N_EVAL, 2)
    calls = {"accumulate": lambda: t.fit(train, batch_size=ROWS, accumulate_grad_batches=2, verbose=0),
             "rows": lambda: t.fit(train, batch_size=6, verbose=0),
             "eval_rows": lambda: t.evaluate(test, batch_size=2 * ROWS, verbose=0)}
    out = {}
    for name, call in calls.items():
        step = t.global_step
        try:
            call()
            out[name] = None
        except ValueError as e:
            out[name] = (str(e), t.global_step == step)
    return out


def _pp(rank, world, degrees, out_dir):
    torch.set_num_threads(1)
    init_fleet(degrees, PIPE)
    strategy = fleet.user_strategy()
    stage = pipeline_stage(loss_fn=None, tp=degrees["mp_degree"] > 1)  # the Trainer's loss becomes the pipeline's
    t, out = run_trainer(stage, strategy, ROWS, ROWS, clip=CLIP, loss=nn.CrossEntropyLoss())
    out["evaluate_small"] = t.evaluate(dataset(N_EVAL, 2), batch_size=3, verbose=0)  # every batch padded
    out["weights"] = all_stage_weights(stage)
    out.update(more_predictions(t, ROWS, out_dir))  # the loss-free schedule (no labels): after every fit
    out["errors"] = _errors(t)
    out["stage_params"] = sum(p.numel() for p in stage.parameters())
    return out


def _check(results, ref):
    for r in results:
        assert not compare(r, ref), compare(r, ref)
        assert r["predict"].shape[0] == N_EVAL
        for key, v in ref["evaluate_small"].items():
            assert abs(r["evaluate_small"][key] - v) <= 1e-5, (key, r["evaluate_small"], ref["evaluate_small"])
        assert r["stage_params"] < sum(w.numel() for w in ref["weights"].values())  # a stage, not the model
        errors = r["errors"]
        assert errors["accumulate"] and "pipeline_configs['accumulate_steps']" in errors["accumulate"][0]
        assert errors["rows"] and f"= {ROWS} rows per step" in errors["rows"][0]
        assert errors["eval_rows"] and f"batch_size <= {ROWS}" in errors["eval_rows"][0]
        assert all(e[1] for e in errors.values())  # no step was taken


@pytest.mark.timeout(300)
def test_pp2_trainer_equals_one_process(tmp_path):
    ref = _reference(ROWS)
    _check(run_ranks(_pp, 2, args=({"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}, str(tmp_path)), timeout=240), ref)


@pytest.mark.timeout(400)
def test_dp2_pp2_trainer_equals_one_process_with_the_global_batch(tmp_path):
    ref = _reference(2 * ROWS)
    _check(run_ranks(_pp, 4, args=({"dp_degree": 2, "mp_degree": 1, "pp_degree": 2}, str(tmp_path)), timeout=300),
           ref)


@pytest.mark.timeout(400)
def test_mp2_pp2_trainer_equals_one_process(tmp_path):
    ref = _reference(ROWS)
    _check(run_ranks(_pp, 4, args=({"dp_degree": 1, "mp_degree": 2, "pp_degree": 2}, str(tmp_path)), timeout=300),
           ref)
