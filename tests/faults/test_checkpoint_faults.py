"""Checkpoint writes that fail: disk full in the middle of a save, an unwritable directory, a process killed
halfway through a save. Each gives a clear error (before training where it can be known then), and the
previous checkpoint stays intact, loadable and resumable."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from faults_helpers import RECIPE_ARGS, WRAPPER, assert_bit_identical, data, launch_env, tiny_trainer, weights

from fleetlite.checkpoint import CheckpointError, find_newest, load_checkpoint
from fleetlite.checkpoint import files as checkpoint
from fleetlite.trainer.callbacks import ModelCheckpoint

HERE = Path(__file__).resolve().parent


def _fill_disk_after(monkeypatch, good_saves: int) -> None:
    """From the save after ``good_saves`` good ones, write half the bytes, then fail as a full disk does."""
    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) <= good_saves:
            return real_save(obj, f, *args, **kwargs)
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", save)


def test_disk_full_in_the_middle_of_a_save_is_a_clear_error_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    _fill_disk_after(monkeypatch, good_saves=1)
    t = tiny_trainer()
    with pytest.raises(CheckpointError) as info:
        t.fit(data(), epochs=2, batch_size=8, verbose=0,
              callbacks=[ModelCheckpoint(str(tmp_path), save_freq=None, save_steps=2, keep_last=1)])
    message = str(info.value)
    assert "step-00000004.pt" in message and "No space left on device" in message
    assert "the previous checkpoint, if any, is unchanged" in message and "Free disk space" in message
    assert t.global_step == 4  # it stopped at the failed save, not later
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt", "step-00000002.pt"]  # no temporary left
    assert load_checkpoint(tmp_path / "latest.pt")["progress"]["global_step"] == 2
    assert find_newest(tmp_path) == tmp_path / "latest.pt"


def test_unwritable_checkpoint_directory_fails_before_the_first_step(tmp_path):
    (tmp_path / "file").write_text("a file where a directory should be")  # root can write anywhere else
    t = tiny_trainer()
    with pytest.raises(CheckpointError, match=r"file/ckpt: is not writable \(Not a directory\); checkpoints could "
                                              "not be saved. Choose a writable save_dir"):
        t.fit(data(), epochs=1, batch_size=8, verbose=0, callbacks=[ModelCheckpoint(str(tmp_path / "file" / "ckpt"))])
    assert t.global_step == 0


@pytest.mark.timeout(90)
def test_process_killed_halfway_through_a_save_leaves_the_previous_checkpoint_resumable(tmp_path):
    ckpt = tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", f"import faults_helpers as h; h.fit_dying_in_a_save({str(ckpt)!r})"],
                          capture_output=True, text=True, env=env, timeout=80)
    assert proc.returncode == -9, proc.stderr[-2000:]
    names = sorted(p.name for p in ckpt.iterdir())
    assert names[1:] == ["latest.pt", "step-00000002.pt"]
    assert names[0].startswith(".step-00000004.pt.tmp-")  # the torn file never got the checkpoint's name
    assert load_checkpoint(find_newest(ckpt))["progress"]["global_step"] == 2

    resumed = tiny_trainer()
    resumed.fit(data(), epochs=2, batch_size=8, verbose=0, resume="latest",
                callbacks=[ModelCheckpoint(str(ckpt), save_freq=None, save_steps=2)])
    assert not [p for p in ckpt.iterdir() if ".tmp-" in p.name]  # the dead save's leftover is cleaned up
    straight = tiny_trainer()
    straight.fit(data(), epochs=2, batch_size=8, verbose=0)
    assert_bit_identical(weights(resumed), weights(straight))


@pytest.mark.timeout(90)
def test_recipe_reports_a_full_disk_on_one_line_and_keeps_its_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, **launch_env(FAULT="enospc", FAULT_STEP="1", FAULT_DIR=str(tmp_path)))
    proc = subprocess.run([sys.executable, str(WRAPPER), *RECIPE_ARGS, f"run_dir={run_dir}"], capture_output=True,
                          text=True, env=env, cwd=str(tmp_path), timeout=80)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == (f"error: checkpoint {run_dir}/checkpoints/step-00000006.pt: saving failed on rank 0: writing "
                         "failed (No space left on device); the previous checkpoint, if any, is unchanged. Free disk "
                         "space or choose a writable save_dir"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["progress"]["global_step"] == 3
