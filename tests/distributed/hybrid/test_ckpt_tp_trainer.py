"""Trainer checkpoints of a tensor-parallel model (mp = 2, 2 ranks): DCP directories that resume bit-identically
and reshard, and a full-model export.

References: the uninterrupted run (resume: full weights and each rank's optimizer state ``torch.equal``), the
saved model's full weights (gathered by ``get_weights`` when the checkpoint was written: a reshard to mp = 1 in
one process or under dp = 2 must load exactly them), and the single-process twin ``RefNet`` (the export loads
into it).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from hybrid_models import RefNet, TPNet, batches, degrees, init_fleet, opt_state, tp_trainer

import fleetlite
import fleetlite.checkpoint as ckpt
from fleetlite.checkpoint import CheckpointError
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.static import InputSpec
from fleetlite.testing import run_ranks
from fleetlite.trainer.callbacks import ModelCheckpoint
from fleetlite.trainer.export import load_safetensors

EPOCHS = 2  # 6 batches each


def _mp2_runs(rank, world, root):
    root = Path(root)
    out = {}
    t = tp_trainer()  # the uninterrupted run (it checkpoints too: the saves must not change it)
    t.fit(batches(), epochs=EPOCHS, save_dir=root / "whole", verbose=0)
    out["whole"], out["whole_opt"] = t.get_weights(), opt_state(t)
    out["export"] = t.export(root / "tp.safetensors")
    t.save(root / "weights", training=False)

    t = tp_trainer()  # stopped at an epoch end, resumed
    t.fit(batches(), epochs=1, save_dir=root / "epoch", verbose=0)
    out["at_epoch_0"] = t.get_weights()
    t = tp_trainer()
    t.fit(batches(), epochs=EPOCHS, save_dir=root / "epoch", resume="latest", verbose=0)
    out["epoch"], out["epoch_opt"] = t.get_weights(), opt_state(t)

    t = tp_trainer()  # ModelCheckpoint(async_save=True): written in the background, resumed alike
    t.fit(batches(), epochs=1, callbacks=[ModelCheckpoint(root / "async", async_save=True)], verbose=0)
    t = tp_trainer()
    t.fit(batches(), epochs=EPOCHS, callbacks=[ModelCheckpoint(root / "async", async_save=True)], resume="latest",
          verbose=0)
    out["async"], out["async_opt"] = t.get_weights(), opt_state(t)

    t = tp_trainer()  # stopped mid-epoch (after 3 of 6 steps), resumed
    t.fit(batches(), epochs=EPOCHS, num_iters=3, save_dir=root / "mid", verbose=0)
    t = tp_trainer()
    t.fit(batches(), epochs=EPOCHS, save_dir=root / "mid", resume="latest", verbose=0)
    out["mid"], out["mid_opt"] = t.get_weights(), opt_state(t)

    t = tp_trainer()  # Trainer.save / Trainer.load: a directory, the optimizer state with it
    t.fit(batches(), epochs=1, verbose=0)
    out["saved_to"] = t.save(root / "by_save.pt")
    fresh = tp_trainer()
    fresh.load(out["saved_to"])
    out["loaded_equal"] = all(torch.equal(v, fresh.get_weights()[k]) for k, v in t.get_weights().items())
    a, b = opt_state(t), opt_state(fresh)
    out["loaded_opt_equal"] = all(torch.equal(a[p][n], b[p][n]) for p in a for n in a[p])
    out["dirs"] = sorted(p.name for p in (root / "mid").iterdir())

    # Paddle's face: Model.save(path, training=False) writes the full weights as {path}.pt
    init_fleet(degrees(mp=2))
    torch.manual_seed(0)
    net = TPNet()
    model = fleetlite.Model(net, [InputSpec([None, 6], "float32", "x")])
    model.prepare(torch.optim.AdamW(net.parameters()), torch.nn.CrossEntropyLoss())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save(str(root / "hapi" / "infer"), training=False)
    out["hapi_warnings"] = [str(w.message) for w in caught]
    out["hapi_full"] = model._trainer.get_weights()
    return out


@pytest.fixture(scope="module")
def mp2(tmp_path_factory):
    root = tmp_path_factory.mktemp("mp2")
    return root, run_ranks(_mp2_runs, world_size=2, args=(str(root),), timeout=400)


def _equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _equal_opt(a, b):
    assert a.keys() == b.keys()
    for p in a:
        for n in a[p]:
            assert torch.equal(a[p][n], b[p][n]), (p, n)


@pytest.mark.timeout(500)
def test_resume_at_an_epoch_end_and_mid_epoch_equals_the_uninterrupted_run(mp2):
    _root, out = mp2
    for rank in (0, 1):
        r = out[rank]
        assert set(r["whole"]) == {"up.weight", "up.bias", "down.weight", "down.bias"}
        assert r["whole"]["up.weight"].shape == (8, 6)  # full weights, gathered from both slices
        for case in ("epoch", "mid", "async"):
            _equal(r[case], r["whole"])
            _equal_opt(r[f"{case}_opt"], r["whole_opt"])  # this rank's slices' AdamW moments and steps
        assert not torch.equal(r["at_epoch_0"]["up.weight"], r["whole"]["up.weight"])  # it did train on
    assert not torch.equal(out[0]["whole_opt"]["up.weight"]["exp_avg"], out[1]["whole_opt"]["up.weight"]["exp_avg"])
    assert "step-00000003" in out[0]["dirs"]  # a directory (DCP shards), also for the stop mid-epoch


@pytest.mark.timeout(500)
def test_trainer_save_writes_a_directory_that_trainer_load_reads(mp2):
    root, out = mp2
    assert out[0]["saved_to"] == root / "by_save" and ckpt.is_checkpoint_dir(root / "by_save")
    assert out[0]["loaded_equal"] and out[0]["loaded_opt_equal"] and out[1]["loaded_equal"]
    assert out[1]["loaded_opt_equal"]


@pytest.mark.timeout(500)
def test_mp2_checkpoint_loads_into_one_process(mp2, clean_dist_env):
    root, out = mp2
    saved = out[0]["at_epoch_0"]
    assert ckpt.load_full(root / "epoch" / "epoch-0000").keys() == saved.keys()
    _equal(ckpt.load_full(root / "epoch" / "epoch-0000"), saved)
    t = tp_trainer(mp=1)
    t.load(root / "epoch" / "epoch-0000")  # weights and AdamW state, mp 2 -> 1
    _equal(t.get_weights(), saved)
    # resumed at the epoch end in one process, the second epoch matches mp = 2's within float rounding
    t = tp_trainer(mp=1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*2-rank checkpoint on 1 ranks")
        t.fit(batches(), epochs=EPOCHS, resume=root / "epoch" / "epoch-0000", save_dir=root / "one", verbose=0)
    for k, v in t.get_weights().items():
        assert (v - out[0]["whole"][k]).abs().max().item() <= 1e-5, k


@pytest.mark.timeout(500)
def test_export_and_weights_file_hold_the_full_model(mp2, clean_dist_env):
    root, out = mp2
    assert out[0]["export"] == root / "tp.safetensors"
    _equal(load_safetensors(RefNet(), root / "tp.safetensors").state_dict(), out[0]["whole"])
    net = RefNet()
    fleetlite.Trainer(net).load(root / "weights.pt")
    _equal(net.state_dict(), out[0]["whole"])
    net = RefNet()  # hapi's Model.save(path, training=False): the weights file holds the full model too
    fleetlite.Trainer(net).load(root / "hapi" / "infer.pt")
    _equal(net.state_dict(), out[0]["hapi_full"])
    assert any("inference program" in w for w in out[0]["hapi_warnings"])  # no program of one rank's slices


def _reshard_to_dp2(rank, world, root, saved_mid):
    t = tp_trainer(mp=1, dp=2)  # RefNet under data parallel over both ranks
    t.load(Path(root) / "epoch" / "epoch-0000")
    weights = t.get_weights()
    refused = None
    t = tp_trainer(mp=1, dp=2)
    try:
        t.fit(batches(), epochs=EPOCHS, resume=saved_mid, verbose=0)
    except CheckpointError as e:
        refused = str(e)
    fleet_impl._reset()  # sharding stage 1 over both ranks: each rank's partition takes its parameters' state
    net = RefNet()
    t = fleetlite.Trainer(net, torch.optim.AdamW(net.parameters(), lr=0.05), torch.nn.CrossEntropyLoss(),
                          strategy={"sharding": True, "sharding_configs": {"stage": 1}})
    t.load(Path(root) / "epoch" / "epoch-0000")
    partition = {k: v["exp_avg"].clone() for k, v in t.optimizer.inner_opt.optim.state_dict()["state"].items()}
    names = [n for n, p in net.named_parameters() if any(p is q for g in t.optimizer.inner_opt.optim.param_groups
                                                           for q in g["params"])]
    return weights, refused, t.get_weights(), dict(zip(names, partition.values()))


@pytest.mark.timeout(500)
def test_mp2_checkpoint_loads_into_dp2_and_stage1_and_mid_epoch_resume_on_other_degrees_is_refused(mp2, clean_dist_env):
    root, out = mp2
    mid = str(root / "mid" / "step-00000003")
    ref = RefNet()  # the mp2 run's AdamW moments at the epoch end, whole (mp 2 -> 1 in one process)
    opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    fleetlite.Trainer(ref, opt, torch.nn.CrossEntropyLoss()).load(root / "epoch" / "epoch-0000")
    whole = {n: opt.state[p]["exp_avg"] for n, p in ref.named_parameters()}
    seen = set()
    for weights, refused, stage1_weights, partition in run_ranks(_reshard_to_dp2, world_size=2,
                                                                 args=(str(root), mid), timeout=300):
        _equal(weights, out[0]["at_epoch_0"])
        _equal(stage1_weights, out[0]["at_epoch_0"])
        for name, exp_avg in partition.items():  # stage 1: this rank's parameters' moments
            assert torch.equal(exp_avg, whole[name]), name
        seen |= set(partition)
        assert refused is not None and "dp=1 x mp=2 x pp=1" in refused and "dp=2 x mp=1 x pp=1" in refused
        assert "epoch end" in refused
    assert seen == set(whole)  # the two partitions cover the model


def _file_into_mp2(rank, world, path):
    t = tp_trainer()
    t.setup()  # (before the model is wrapped, get_weights returns the plain module's: this rank's slices)
    before = t.get_weights()
    try:
        t.load(path)
        refused = None
    except CheckpointError as e:
        refused = str(e)
    untouched = all(torch.equal(v, t.get_weights()[k]) for k, v in before.items())
    t.load(path, reset_optimizer=True)
    return refused, untouched, t.get_weights()


@pytest.mark.timeout(500)
def test_a_single_process_file_loads_its_weights_into_mp2_but_not_its_optimizer(tmp_path, clean_dist_env):
    t = tp_trainer(mp=1)
    t.fit(batches(), epochs=1, verbose=0)
    path = t.save(tmp_path / "one.pt")  # one process: a checkpoint file, AdamW state over whole tensors
    for refused, untouched, weights in run_ranks(_file_into_mp2, world_size=2, args=(str(path),), timeout=300):
        assert refused is not None and "reset_optimizer=True" in refused and untouched  # refused before loading
        _equal(weights, t.get_weights())


def _dropout_runs(rank, world, root):
    root = Path(root)
    t = tp_trainer(dropout=True)
    t.fit(batches(), epochs=EPOCHS, verbose=0)
    whole = t.get_weights()
    t = tp_trainer(dropout=True)
    t.fit(batches(), epochs=EPOCHS, num_iters=3, save_dir=root / "drop", verbose=0)
    t = tp_trainer(dropout=True)
    t.fit(batches(), epochs=EPOCHS, save_dir=root / "drop", resume="latest", verbose=0)
    return whole, t.get_weights()


@pytest.mark.timeout(500)
def test_dropout_under_the_model_parallel_rng_tracker_resumes_bit_identically(tmp_path):
    for whole, resumed in run_ranks(_dropout_runs, world_size=2, args=(str(tmp_path),), timeout=300):
        _equal(resumed, whole)  # the tracker's state (per mp rank) came back with the checkpoint


def _files_asked(rank, world, root):
    t = tp_trainer()
    try:
        t.fit(batches(), epochs=1, callbacks=[ModelCheckpoint(save_dir=root, sharded=False)], verbose=0)
        return None
    except ValueError as e:
        return str(e), t.global_step


@pytest.mark.timeout(120)
def test_model_checkpoint_asked_for_files_is_refused_before_training(tmp_path):
    """ModelCheckpoint(sharded=False) wants single files; a tensor-parallel model writes DCP directories: one line
    before the first step, not a directory where the callback's bookkeeping expects a file."""
    for message, steps in run_ranks(_files_asked, world_size=2, args=(str(tmp_path),), timeout=100):
        assert "sharded=False" in message and "DCP directories" in message and steps == 0
