"""Buffers every rank agrees on after a distributed fit, a plain
DataLoader split across ranks, and a non-finite loss stopping every rank at the same step."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from trainer_helpers import IndexedDataset, RecordingTrainer, dataset, xy

import fleetlite
from fleetlite.checkpoint import CheckpointError, load_checkpoint
from fleetlite.testing import run_ranks
from fleetlite.trainer.callbacks import ModelCheckpoint, NonFiniteLossError, TerminateOnNaN


def bn_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 3))


def bn_trainer() -> fleetlite.Trainer:
    net = bn_net()
    return fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                             metrics=fleetlite.metric.Accuracy(), device="cpu")


# -- 1: evaluate/predict after a distributed fit use rank 0's buffers (what the checkpoint holds) -------------
def _fit_then_evaluate(rank, world, save_dir):
    t = bn_trainer()
    t.fit(dataset(70, seed=3), epochs=2, batch_size=5, verbose=0, save_dir=save_dir)
    ev = t.evaluate(dataset(37, seed=4), batch_size=8, verbose=0)
    pred = t.predict(dataset(37, seed=4), batch_size=8, stack_outputs=True, verbose=0)
    return ev, pred, {k: v.clone() for k, v in t.network.state_dict().items() if "running" in k}


@pytest.mark.timeout(240)
def test_distributed_evaluate_after_fit_equals_the_saved_model(tmp_path):
    results = run_ranks(_fit_then_evaluate, world_size=2, args=(str(tmp_path),), timeout=200)
    single = bn_trainer()
    single.load(tmp_path / "latest.pt")
    want = single.evaluate(dataset(37, seed=4), batch_size=8, verbose=0)
    want_pred = single.predict(dataset(37, seed=4), batch_size=8, stack_outputs=True, verbose=0)
    for ev, pred, buffers in results:
        assert ev["acc"] == want["acc"]
        assert math.isclose(ev["loss"], want["loss"], rel_tol=1e-6), (ev, want)
        torch.testing.assert_close(pred, want_pred, rtol=1e-5, atol=1e-6)
        for k, v in buffers.items():  # the trained model of every rank is the saved one
            assert torch.equal(v, single.network.state_dict()[k]), k


# -- 18: a plain DataLoader on two ranks is split, not trained twice --------------------------------------------
def _plain_loader(rank, world, shuffle):
    torch.manual_seed(0)
    net = nn.Linear(6, 3)
    t = RecordingTrainer(net, torch.optim.SGD(net.parameters(), lr=0.1), nn.CrossEntropyLoss(), device="cpu")
    t.fit(DataLoader(IndexedDataset(21), batch_size=4, shuffle=shuffle), epochs=1, verbose=0)
    ev = t.evaluate(DataLoader(dataset(21), batch_size=4), verbose=0)
    pred = t.predict(DataLoader(dataset(21), batch_size=4), stack_outputs=True)
    return t.seen, t.global_step, ev, pred


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shuffle", [False, True])
def test_plain_dataloader_on_two_ranks_gets_a_distributed_sampler(shuffle):
    (seen0, steps0, ev0, p0), (seen1, steps1, ev1, p1) = run_ranks(_plain_loader, world_size=2, args=(shuffle,),
                                                                   timeout=200)
    assert steps0 == steps1 == 3  # 21 samples, 4 per rank and step: 3 steps, not 6
    assert set(seen0) | set(seen1) == set(range(21))
    assert len(set(seen0) & set(seen1)) <= 3  # only the padding of the last batch repeats
    assert (seen0[:4] != list(range(4))) == shuffle
    assert ev0 == ev1 and p0.shape == (21, 3) and torch.equal(p0, p1)


def _custom_sampler(rank, world):
    import warnings

    from torch.utils.data import SubsetRandomSampler

    t = bn_trainer()
    loader = DataLoader(dataset(20), batch_size=5, sampler=SubsetRandomSampler(range(20)))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        t.fit(loader, epochs=2, verbose=0)
    return [str(w.message) for w in rec], t.global_step


@pytest.mark.timeout(240)
def test_a_loader_with_a_custom_sampler_is_kept_with_one_warning():
    for messages, steps in run_ranks(_custom_sampler, world_size=2, timeout=200):
        assert steps == 8  # the whole loader on each rank: 4 batches, 2 epochs
        assert len(messages) == 1 and "custom sampler and no distributed one" in messages[0], messages


# -- 15: a non-finite loss stops every rank at the same step; latest.pt never gets non-finite weights --------
class _PoisonOnRank1(TensorDataset):
    """Sample 15 is NaN: it lands on rank 1 only (Paddle's layout, no shuffle, batch 2: its 4th batch)."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return (x * float("nan") if i == 15 else x), y


def _diverge(rank, world, save_dir):
    t = bn_trainer()
    try:
        t.fit(_PoisonOnRank1(*xy(40)), epochs=2, batch_size=2, shuffle=False, verbose=0,
              callbacks=[ModelCheckpoint(save_dir, save_freq=None, save_steps=1), TerminateOnNaN(raise_error=True)])
    except NonFiniteLossError as e:
        return str(e), t.global_step
    return None, t.global_step


@pytest.mark.timeout(240)
def test_a_nan_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    (msg0, step0), (msg1, step1) = run_ranks(_diverge, world_size=2, args=(str(tmp_path),), timeout=200)
    assert step0 == step1 == 4
    assert msg0 == msg1 and "non-finite loss" in msg0 and "optimizer step 4" in msg0 and "rank 1" in msg0
    assert "lower learning rate" in msg0
    latest = load_checkpoint(tmp_path / "latest.pt")
    assert latest["progress"]["global_step"] == 3
    assert all(torch.isfinite(v).all() for v in latest["model"].values() if v.is_floating_point())


def test_a_checkpoint_with_non_finite_weights_never_replaces_latest(tmp_path):
    t = bn_trainer()
    t.fit(dataset(20), epochs=1, batch_size=5, verbose=0, save_dir=tmp_path)
    before = (tmp_path / "latest.pt").read_bytes()
    with torch.no_grad():
        t.network[0].weight[0, 0] = float("inf")
    with pytest.raises(CheckpointError, match=r"non-finite.*0\.weight.*latest\.pt"):
        t.save_checkpoint(tmp_path / "step-9.pt", latest=True)
    assert (tmp_path / "latest.pt").read_bytes() == before and not (tmp_path / "step-9.pt").exists()
