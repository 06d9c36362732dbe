"""SIGTERM (pre-emption): every rank stops after the same optimizer step, a checkpoint is written, the process
exits cleanly (143 = 128 + SIGTERM), and resuming ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from faults_helpers import (
    RECIPE_ARGS,
    STEPS,
    WRAPPER,
    Fault,
    alive,
    assert_bit_identical,
    data,
    final_model,
    fit_preempted,
    fit_preempted_default_interval,
    launch_env,
    tiny_trainer,
)

from fleetlite.checkpoint import load_checkpoint
from fleetlite.testing import run_launch, run_ranks
from fleetlite.trainer.callbacks import ModelCheckpoint, Preemption


def test_one_process_stops_at_the_next_step_and_restores_the_handler(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    t = tiny_trainer()
    t.fit(data(), epochs=2, batch_size=8, verbose=0,
          callbacks=[ModelCheckpoint(str(tmp_path), save_freq=None), Preemption(verbose=0), Fault(0, 5, "term")])
    assert t.preempted == "SIGTERM" and t.global_step == 6  # the signal came before step 6: it stopped after it
    assert load_checkpoint(tmp_path / "latest.pt")["progress"]["global_step"] == 6
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.timeout(90)
def test_ranks_agree_on_the_stop_step_when_one_rank_gets_the_signal(tmp_path):
    # rank 1 alone gets SIGTERM before step 3 (of 6 per epoch); agreeing at every step (check_interval_s=0), its
    # flag goes out after step 3 and is read after step 4
    out = run_ranks(fit_preempted, args=(str(tmp_path), 1, 2), timeout=80)
    (ref0, stop0, restored0, resumed0), (ref1, stop1, restored1, resumed1) = out
    assert stop0[0] == "a signal on another rank" and stop1[0] == "SIGTERM"
    assert stop0[1] == stop1[1] == 4  # the same step on both ranks, one step after the signal
    assert stop0[2] == ["latest.pt", f"step-{stop0[1]:08d}.pt"]
    assert restored0 and restored1
    for ref, resumed in ((ref0, resumed0), (ref1, resumed1)):
        assert_bit_identical(resumed, ref)
    assert_bit_identical(ref1, ref0)


@pytest.mark.timeout(60)
def test_with_the_default_interval_a_signal_late_in_training_still_stops_every_rank_alike(tmp_path):
    out = run_ranks(fit_preempted_default_interval, args=(str(tmp_path),), timeout=50)
    (why0, step0), (why1, step1) = out
    assert why0 == "a signal on another rank" and why1 == "SIGTERM"  # rank 1 alone got it
    assert step0 == step1  # steps of ~1 ms: the next poll may only come at the end of training
    assert load_checkpoint(tmp_path / "latest.pt")["progress"]["global_step"] == step0


def _wait_for_step(path, at_least: int, proc, timeout: float = 90) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the launcher ended before step {at_least}: {proc.communicate()}")
        try:
            step = int(path.read_text())
            if step >= at_least:
                return step
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"no step {at_least} within {timeout} s")


@pytest.mark.timeout(150)
def test_sigterm_to_launch_checkpoints_exits_cleanly_and_resumes_bit_identical(tmp_path, straight_run):
    run_dir = tmp_path / "run"
    # rank 0 holds after step 4 until the signal is there: it comes before training ends, whatever the load
    env = dict(os.environ, **launch_env(FAULT_DIR=str(tmp_path), FAULT_HOLD="4:SIGTERM"))
    cmd = [sys.executable, "-m", "fleetlite.cli", "launch", "--nproc_per_node", "2", str(WRAPPER), *RECIPE_ARGS,
           f"run_dir={run_dir}", "resume=auto"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(tmp_path), start_new_session=True)
    try:
        _wait_for_step(tmp_path / "step", 4, proc)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)  # the launcher only: torchrun passes it on to the workers
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    ended = time.time()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "fleetlite launch: stopped by SIGTERM" in err and "Traceback" not in err
    stop = int(out.split("SIGTERM received: every rank stops after optimizer step ")[1].split(";")[0])
    assert 4 <= stop < STEPS  # rank 0 held after step 4 until the signal came: it stopped before the end
    assert f"pre-empted (SIGTERM) after optimizer step {stop}: checkpoint in {run_dir}/checkpoints" in out
    saved = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert saved["progress"]["global_step"] == stop
    assert not [p for p in (int((tmp_path / f"pid-{r}").read_text()) for r in (0, 1)) if alive(p)]
    print(f"\n[detect] SIGTERM to the launcher: stopped after step {stop}, checkpoint written, launcher exited "
          f"{ended - sent:.2f} s after the signal")

    again = run_launch(["--nproc_per_node", "2", str(WRAPPER), *RECIPE_ARGS, f"run_dir={run_dir}", "resume=auto"],
                       timeout=120, cwd=str(tmp_path), env=launch_env(FAULT_DIR=str(tmp_path)))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {run_dir}/checkpoints/latest.pt" in again.stdout
    assert_bit_identical(final_model(run_dir), final_model(straight_run))
    assert (run_dir / "metrics.csv").read_text() == (straight_run / "metrics.csv").read_text()
    assert torch.equal(load_checkpoint(run_dir / "checkpoints" / "latest.pt")["ranks"][1]["rng"]["torch"],
                       load_checkpoint(straight_run / "checkpoints" / "latest.pt")["ranks"][1]["rng"]["torch"])


def test_bad_arguments_say_what_to_pass():
    with pytest.raises(ValueError, match=r"unknown signal name\(s\) \['SIGFOO'\]; use names such as 'SIGTERM'"):
        Preemption(signals=["SIGFOO"])
    with pytest.raises(ValueError, match=r"check_interval_s=-1\) must be seconds in \[0, 60\]"):
        Preemption(check_interval_s=-1)


def test_ctrl_c_is_handled_like_sigterm_and_a_second_one_stops_at_once(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    t = tiny_trainer()

    class CtrlC(Fault):
        def on_train_batch_begin(self, step, logs=None):
            if self.trainer.global_step == self.step and self.trainer.at_step_boundary:
                self.step = -1
                os.kill(os.getpid(), signal.SIGINT)  # not a KeyboardInterrupt: a flag, then a clean stop
                os.kill(os.getpid(), signal.SIGINT)  # the same Ctrl-C arriving twice is not a second one

    t.fit(data(), epochs=2, batch_size=8, verbose=0,
          callbacks=[ModelCheckpoint(str(tmp_path), save_freq=None), Preemption(verbose=0), CtrlC(0, 5, "int")])
    assert t.preempted == "SIGINT" and t.global_step == 6
    assert load_checkpoint(tmp_path / "latest.pt")["progress"]["global_step"] == 6
    assert signal.getsignal(signal.SIGINT) is before
    p = Preemption()
    p._install()
    try:
        p._handle(signal.SIGINT, None)
        p._received_at -= 2.0  # the user presses again, seconds later
        with pytest.raises(KeyboardInterrupt, match="second Ctrl-C"):
            p._handle(signal.SIGINT, None)
        assert signal.getsignal(signal.SIGINT) is before  # a third one gets Python's default
    finally:
        p._uninstall()


@pytest.mark.timeout(150)
def test_ctrl_c_to_launch_stops_every_rank_after_the_same_step_with_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, **launch_env(FAULT_DIR=str(tmp_path), FAULT_HOLD="3:SIGINT"))
    cmd = [sys.executable, "-m", "fleetlite.cli", "launch", "--nproc_per_node", "2", str(WRAPPER), *RECIPE_ARGS,
           f"run_dir={run_dir}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(tmp_path), start_new_session=True)
    try:
        _wait_for_step(tmp_path / "step", 3, proc)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the launcher's whole process group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "fleetlite launch: stopped by SIGINT" in err
    stop = int(out.split("SIGINT received: every rank stops after optimizer step ")[1].split(";")[0])
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["progress"]["global_step"] == stop
    assert len([ln for ln in err.splitlines() if ln.strip()]) <= 3  # at most one line per rank, and the launcher's
    assert not [p for p in (int((tmp_path / f"pid-{r}").read_text()) for r in (0, 1)) if alive(p)]
