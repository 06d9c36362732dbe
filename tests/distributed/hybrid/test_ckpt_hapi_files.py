"""Paddle's ``Model.save(path)`` / ``Model.load(path)`` (``.pdparams`` + ``.pdopt``) of hybrid models: collective,
the full model and its full optimizer state (by parameter name), loadable into one process and back into the
same degrees.

References: a single-process ``fleetlite.Model`` trained on the same batches from the same weights (its weights
and AdamW moments equal the files' within 1e-5); the hybrid run's own state (a load back into the same degrees is
``torch.equal`` to what each rank held when it saved).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hybrid_models import (
    PIPE,
    OneStage,
    RefNet,
    TPNet,
    batches,
    degrees,
    init_fleet,
    opt_state,
    pipe_batch,
    pipe_layer,
    start_weights,
)
from torch import nn

import fleetlite
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.testing import run_ranks
from fleetlite.trainer.hapi_io import safe_load


def _model(net, loss=None):
    model = fleetlite.Model(net)
    model.prepare(torch.optim.AdamW(net.parameters(), lr=0.05), loss or nn.CrossEntropyLoss())
    return model


def _tp(rank, world, root):
    init_fleet(degrees(mp=2))
    torch.manual_seed(0)
    model = _model(TPNet())
    model.trainer.setup(training=True)
    start = model.trainer.get_weights()  # the reference starts from these full weights
    model.fit(batches(), epochs=1, verbose=0)
    model.save(str(Path(root) / "m"))
    held = (model.trainer.get_weights(), opt_state(model.trainer), start)
    init_fleet(degrees(mp=2))
    torch.manual_seed(1)  # other weights: the load must set every one
    again = _model(TPNet())
    again.load(str(Path(root) / "m"))
    return held, (again.trainer.get_weights(), opt_state(again.trainer))


def _reference(net, fit):
    fleet_impl._reset()
    model = _model(net)
    fit(model)
    return model.trainer.get_weights(), opt_state(model.trainer)


def _check_files(root, ref_weights, ref_opt):
    weights, opt = safe_load(str(root / "m.pdparams")), safe_load(str(root / "m.pdopt"))
    assert weights.keys() == ref_weights.keys()
    for k, v in ref_weights.items():
        assert (weights[k] - v).abs().max() <= 1e-5, k
    for fqn, entry in ref_opt.items():
        for name, v in entry.items():
            assert (opt[f"state.{fqn}.{name}"] - v).abs().max() <= 1e-5, (fqn, name)
    fleet_impl._reset()
    torch.manual_seed(3)
    loaded = _model(RefNet() if "up.weight" in weights else OneStage())
    loaded.load(str(root / "m"))  # into one process: the full weights and moments
    loaded.save(str(root / "single"))  # a single-process save: torch's index-keyed optimizer state
    for k, v in ref_weights.items():
        assert (loaded.trainer.get_weights()[k] - v).abs().max() <= 1e-5, k
    for fqn, entry in opt_state(loaded.trainer).items():
        for name, v in entry.items():
            assert (v - ref_opt[fqn][name]).abs().max() <= 1e-5, (fqn, name)


def _check_roundtrip(results):
    for held, again in results:
        for k, v in held[0].items():
            assert torch.equal(again[0][k], v), k
        for fqn, entry in held[1].items():
            for name, v in entry.items():
                assert torch.equal(again[1][fqn][name], v), (fqn, name)


def _refuse_single(rank, world, root):
    init_fleet(degrees(mp=2))
    torch.manual_seed(0)
    model = _model(TPNet())
    model.trainer.setup(training=True)
    before = model.trainer.get_weights()
    try:
        model.load(str(Path(root) / "single"))
        return None
    except ValueError as e:
        after = model.trainer.get_weights()
        return str(e), all(torch.equal(after[k], v) for k, v in before.items())


@pytest.mark.timeout(200)
def test_model_save_of_mp2_holds_the_full_model_and_optimizer(tmp_path):
    results = run_ranks(_tp, world_size=2, args=(str(tmp_path),), timeout=180)
    _check_roundtrip(results)
    net = RefNet()
    net.load_state_dict(results[0][0][2])
    ref = _reference(net, lambda m: m.fit(batches(), epochs=1, verbose=0))
    _check_files(tmp_path, *ref)
    for message, unchanged in run_ranks(_refuse_single, world_size=2, args=(str(tmp_path),), timeout=180):
        assert "index-keyed" in message and "reset_optimizer=True" in message and unchanged


def _pp(rank, world, root):
    hcg = init_fleet(degrees(pp=2), PIPE)
    loss = nn.CrossEntropyLoss()
    layer = pipe_layer(loss, topology=hcg.topology())
    layer.load_state_dict({k: v for k, v in start_weights().items() if k in layer.state_dict()})
    model = _model(layer, loss)
    model.trainer.setup(training=True)
    for step in range(3):
        model.trainer.parallel_network.train_batch(list(pipe_batch(step)), model.trainer.optimizer)
    model.save(str(Path(root) / "m"))
    held = (model.trainer.get_weights(), opt_state(model.trainer))
    hcg = init_fleet(degrees(pp=2), PIPE)
    again = _model(pipe_layer(loss, topology=hcg.topology()), loss)
    again.load(str(Path(root) / "m"))
    return held, (again.trainer.get_weights(), opt_state(again.trainer))


def _pp_fit(model):
    model.trainer.setup(training=True)
    loss = nn.CrossEntropyLoss()
    for step in range(3):
        x, y = pipe_batch(step)
        model.trainer.optimizer.zero_grad()
        loss(model.network(x), y).backward()
        model.trainer.optimizer.step()


@pytest.mark.timeout(200)
def test_model_save_of_pp2_holds_every_stage_and_its_optimizer(tmp_path):
    results = run_ranks(_pp, world_size=2, args=(str(tmp_path),), timeout=180)
    _check_roundtrip(results)
    fleet_impl._reset()
    net = OneStage()
    net.load_state_dict(start_weights())
    ref = _reference(net, _pp_fit)
    _check_files(tmp_path, *ref)
