"""A pipeline fit refused for its two losses (the Trainer's and the PipelineLayer's loss_fn) leaves nothing
half-built: retried after ``compile(loss=<the layer's loss_fn>)`` it trains as one process does (pp2, history and
every stage's weights); ``fleetlite.Model.train_batch`` after the same refusal is refused on every rank too, and
runs no stage alone."""

import os
import sys

import pytest
import torch
from torch import nn

import fleetlite
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.testing import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "distributed", "hybrid"))
from hybrid_models import all_stage_weights, dataset, init_fleet, pipeline_stage, reference_net  # noqa: E402

PIPE = {"accumulate_steps": 2, "micro_batch_size": 4}
ROWS = 8
DEGREES = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}


def _fit(t):
    return t.fit(dataset(32, 1), epochs=2, batch_size=ROWS, shuffle=False, verbose=0).history["loss"]


def _reference():
    fleet_impl._reset()
    net = reference_net()
    t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), nn.CrossEntropyLoss(), device="cpu")
    return _fit(t), {k: v.detach().clone() for k, v in net.state_dict().items()}


def _retry(rank, world):
    torch.set_num_threads(1)
    init_fleet(DEGREES, PIPE)
    strategy = fleet_impl.user_strategy()
    stage = pipeline_stage(loss_fn=nn.CrossEntropyLoss())
    t = fleetlite.Trainer(stage, torch.optim.SGD(stage.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                          strategy=strategy, device="cpu")
    with pytest.raises(ValueError, match="loss_fn differ"):
        _fit(t)
    t.compile(loss=stage._loss_fn)  # the one loss: the retry
    return _fit(t), all_stage_weights(stage), t.global_step


def _model_train_batch(rank, world):
    torch.set_num_threads(1)
    init_fleet(DEGREES, PIPE)  # fleetlite.Model takes the strategy given to fleet.init
    stage = pipeline_stage(loss_fn=nn.CrossEntropyLoss())
    before = {k: v.detach().clone() for k, v in stage.state_dict().items()}
    model = fleetlite.Model(stage)
    model.prepare(torch.optim.SGD(stage.parameters(), lr=0.1), nn.CrossEntropyLoss())
    x, y = dataset(ROWS, 1).tensors
    errors = []
    for call in (lambda: model.fit(dataset(16, 1), batch_size=ROWS, verbose=0),
                 lambda: model.train_batch([x], [y])):
        try:
            call()
            errors.append(None)
        except (ValueError, NotImplementedError) as e:
            errors.append(str(e))
    after = stage.state_dict()
    return errors, all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.timeout(300)
def test_pipeline_fit_retried_after_the_two_losses_error_trains_as_one_process():
    losses, weights = _reference()
    for got_losses, got_weights, steps in run_ranks(_retry, 2, timeout=240):
        torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(losses), rtol=1e-5, atol=1e-5)
        assert sorted(got_weights) == sorted(weights)
        for k in weights:
            torch.testing.assert_close(got_weights[k], weights[k], rtol=1e-5, atol=1e-5)
        assert steps == 2 * 32 // ROWS


@pytest.mark.timeout(300)
def test_model_train_batch_after_the_two_losses_error_is_refused_on_every_rank():
    for errors, unchanged in run_ranks(_model_train_batch, 2, timeout=240):
        assert errors[0] is not None and "loss_fn differ" in errors[0]
        assert errors[1] is not None and ("loss_fn differ" in errors[1] or "pipeline model" in errors[1]), errors
        assert unchanged  # no stage trained alone
