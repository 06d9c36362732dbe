"""Resume: a run stopped after any step and resumed ends bit-identical to a straight run (1 and 2 ranks);
a 2-rank checkpoint resumed on 1 rank sees each remaining sample once; bad checkpoints fail clearly."""

import os

import pytest
import torch
from trainer_helpers import IndexedDataset, NoisyDataset, RecordingTrainer, dataset, params, trainer

from fleetlite.checkpoint import CheckpointError
from fleetlite.testing import run_ranks
from fleetlite.trainer import callbacks as C


class StopAt(C.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, step, logs=None):
        if self.trainer.global_step == self.step and self.trainer.at_step_boundary:
            self.trainer.stop_training = True


def _run(ckpt_dir, stop=None, resume=None, accumulate=1, n=37, batch_size=8, save_steps=None):
    t = trainer(dropout=0.3)
    sched = torch.optim.lr_scheduler.StepLR(t.user_optimizer, step_size=1, gamma=0.7)
    # without save_steps ModelCheckpoint still writes the state at the end (or stop) of training
    cbs = [C.LRScheduler(sched), C.EarlyStopping(monitor="val_loss", patience=5, verbose=0),
           C.ModelCheckpoint(str(ckpt_dir), save_freq=None, save_steps=save_steps, keep_last=3)]
    if stop is not None:
        cbs.append(StopAt(stop))
    hist = t.fit(NoisyDataset(n), eval_data=dataset(9), epochs=3, batch_size=batch_size, callbacks=cbs,
                 accumulate_grad_batches=accumulate, resume=resume, verbose=0)
    return params(t), hist.history, t.global_step


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("stop,accumulate", [(5, 1), (7, 1), (4, 2)])
def test_resume_bit_identical_single_process(tmp_path, stop, accumulate):
    # 37 samples, batches of 8: 5 batches per epoch; step 5 is the last batch of epoch 0 (its end still to run)
    ref, ref_hist, ref_steps = _run(tmp_path / "straight", accumulate=accumulate)
    _, _, stopped_at = _run(tmp_path / "b", stop=stop, accumulate=accumulate)
    assert stopped_at == stop
    got, hist, steps = _run(tmp_path / "b", resume="latest", accumulate=accumulate)
    _assert_same(ref, got)
    assert hist == ref_hist and steps == ref_steps  # History (a checkpointed callback) continues too


def test_resume_falls_back_over_a_damaged_latest(tmp_path):
    ref, _, _ = _run(tmp_path / "straight")
    _run(tmp_path / "b", stop=6, save_steps=1)
    latest = tmp_path / "b" / "latest.pt"
    newest = tmp_path / "b" / "step-00000006.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # latest.pt is the same file (hard link)
    assert latest.stat().st_size == 1000
    with pytest.warns(UserWarning, match="falling back to step-00000005.pt"):
        got, _, _ = _run(tmp_path / "b", resume="latest")
    _assert_same(ref, got)


def test_resume_errors_are_clear(tmp_path):
    with pytest.raises(CheckpointError, match="holds no valid checkpoint"):
        _run(tmp_path / "empty", resume="latest")
    _, _, steps = _run(tmp_path / "auto", resume="auto")  # nothing there: a fresh start
    assert steps == 15
    with pytest.raises(CheckpointError, match="no such file"):
        _run(tmp_path / "x", resume=tmp_path / "missing.pt")
    t = trainer()
    t.network = torch.nn.Sequential(torch.nn.Linear(6, 4))
    t._given_model = t.network
    t.user_optimizer = torch.optim.SGD(t.network.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match=r"latest\.pt: incompatible with this model"):
        t.fit(dataset(8), epochs=1, resume=tmp_path / "auto" / "latest.pt", verbose=0)
    with pytest.raises(CheckpointError, match="incompatible with this run.*dataset of 37 samples"):
        trainer().fit(dataset(30), epochs=3, resume=tmp_path / "auto" / "latest.pt", verbose=0)


def _two_rank_resume(rank, world, root):
    torch.set_num_threads(1)
    ref, ref_hist, _ = _run(f"{root}/straight")
    _run(f"{root}/b", stop=3)
    got, hist, _ = _run(f"{root}/b", resume="latest")
    return all(torch.equal(ref[k], got[k]) for k in ref), hist == ref_hist, {k: v.sum().item() for k, v in got.items()}


@pytest.mark.timeout(90)
def test_resume_bit_identical_two_ranks(tmp_path):
    r0, r1 = run_ranks(_two_rank_resume, args=(str(tmp_path),), timeout=80)
    assert r0[0] and r1[0] and r0[1] and r1[1]
    assert r0[2] == r1[2]  # ranks agree


def _record(ckpt, stop, resume, world):
    t = trainer(cls=RecordingTrainer)
    t.seen = []
    cbs = [C.ModelCheckpoint(ckpt, save_freq=None, save_steps=1)] + ([StopAt(stop)] if stop else [])
    t.fit(IndexedDataset(40), epochs=2, batch_size=4, callbacks=cbs, resume=resume, verbose=0)
    return t.seen, t.global_step


def _two_rank_part(rank, world, ckpt):
    torch.set_num_threads(1)
    return _record(ckpt, stop=2, resume=None, world=world)


@pytest.mark.timeout(90)
def test_resume_on_fewer_ranks_sees_each_remaining_sample_once(tmp_path):
    ckpt = str(tmp_path / "ck")
    parts = run_ranks(_two_rank_part, args=(ckpt,), timeout=80)
    before = [i for seen, _ in parts for i in seen]
    assert len(before) == 16 and len(set(before)) == 16  # 2 steps x 2 ranks x 4 samples
    with pytest.warns(UserWarning, match="resuming a 2-rank checkpoint on 1 ranks"):
        after, steps = _record(ckpt, stop=None, resume="latest", world=1)
    epoch0 = before + after[:24]
    assert sorted(epoch0) == list(range(40))  # the rest of the epoch: each remaining sample exactly once
    assert sorted(after[24:]) == list(range(40)) and len(after) == 64 and steps == 2 + 6 + 10
    assert os.path.exists(os.path.join(ckpt, "latest.pt"))
