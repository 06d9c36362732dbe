"""Pre-emption on SLURM: SIGUSR1 (``--signal=USR1@90``) checkpoints on every rank, rank 0 requeues the job with
``scontrol requeue $SLURM_JOB_ID`` (a stand-in ``scontrol`` on PATH records the call), and the requeued run's
``resume="latest"`` ends with the weights of a run never stopped (the reference: a straight fit)."""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from fleetlite.distributed import cluster
from fleetlite.testing import run_ranks
from fleetlite.trainer.callbacks import Callback, ModelCheckpoint, Preemption

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults_helpers import assert_bit_identical, data, fit_straight, tiny_trainer, weights  # noqa: E402

# records its arguments and whether a checkpoint was already there when it was called
SCONTROL = """#!/bin/sh
ls "$CKPT_DIR" | grep -c '^step-\\|latest' > "$CALLS.ckpt.$$"
echo "$@" >> "$CALLS"
"""


class Usr1(Callback):
    """Sends SIGUSR1 to this rank before optimizer step ``step`` + 1 (what SLURM sends before the time limit)."""

    def __init__(self, ranks, step):
        super().__init__()
        self.ranks, self.step = ranks, step

    def on_train_batch_begin(self, step, logs=None):
        from fleetlite.distributed import get_rank

        if get_rank() in self.ranks and self.trainer.global_step == self.step and self.trainer.at_step_boundary:
            self.step = -1
            os.kill(os.getpid(), signal.SIGUSR1)


def fit_usr1_then_resume(rank, world, save_dir, ranks, requeue):
    reference = fit_straight()
    first = tiny_trainer()
    pre = Preemption(verbose=0, check_interval_s=0, requeue=requeue)
    handled = signal.SIGUSR1 in pre.signals
    first.fit(data(), epochs=3, batch_size=8, verbose=0, save_dir=save_dir,
              callbacks=[ModelCheckpoint(save_dir, save_freq=None), pre, Usr1(ranks, 2)])
    stopped = (first.preempted, first.global_step)
    second = tiny_trainer()
    second.fit(data(), epochs=3, batch_size=8, verbose=0, save_dir=save_dir, resume="latest",
               callbacks=[ModelCheckpoint(save_dir, save_freq=None), Preemption(verbose=0)])
    return handled, stopped, reference, weights(second), second.global_step


def _stand_in_scontrol(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "scontrol"
    exe.write_text(SCONTROL)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.txt"
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CALLS": str(calls)}, calls


@pytest.mark.timeout(300)
def test_usr1_checkpoints_requeues_once_and_the_requeued_run_continues_bit_identical(tmp_path):
    env, calls = _stand_in_scontrol(tmp_path)
    save_dir = tmp_path / "ckpt"
    env.update({"SLURM_JOB_ID": "4242", "CKPT_DIR": str(save_dir)})
    out = run_ranks(fit_usr1_then_resume, args=(str(save_dir), (0, 1), None), env=env, timeout=200)
    for handled, stopped, reference, resumed, steps in out:
        assert handled  # SIGUSR1 is handled by default in a SLURM job
        assert stopped == ("SIGUSR1", 4)  # both ranks after the same step (signal before step 3, read after 4)
        assert steps == 18  # 3 epochs of 6 steps: the requeued run went to the end
        assert_bit_identical(resumed, reference)
    assert calls.read_text().splitlines() == ["requeue 4242"]  # once, by rank 0
    marks = list(tmp_path.glob("calls.txt.ckpt.*"))
    assert len(marks) == 1 and int(marks[0].read_text()) >= 1  # the checkpoint was written before the requeue


@pytest.mark.timeout(300)
def test_requeue_follows_the_setting_and_an_array_task_is_named_as_scontrol_wants(tmp_path):
    env, calls = _stand_in_scontrol(tmp_path)
    save_dir = tmp_path / "ckpt"
    env.update({"SLURM_JOB_ID": "99", "SLURM_ARRAY_JOB_ID": "90", "SLURM_ARRAY_TASK_ID": "3",
                "CKPT_DIR": str(save_dir)})
    # only rank 1 gets the signal; requeue=True requeues whatever the signal, from rank 0
    out = run_ranks(fit_usr1_then_resume, args=(str(save_dir), (1,), True), env=env, timeout=200)
    assert [o[1] for o in out] == [("a signal on another rank", 4), ("SIGUSR1", 4)]
    assert calls.read_text().splitlines() == ["requeue 90_3"]
    calls.unlink()
    out = run_ranks(fit_usr1_then_resume, args=(str(tmp_path / "ckpt2"), (0, 1), False), env=env, timeout=200)
    assert [o[1] for o in out] == [("SIGUSR1", 4)] * 2 and not calls.exists()  # requeue=False: never


def test_a_failed_requeue_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'Requested operation is presently disabled' >&2\nexit 1\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    ok, line = cluster.requeue_slurm_job({"SLURM_JOB_ID": "7"})
    assert not ok and line.startswith("could not requeue SLURM job 7: scontrol exited 1 (Requested operation")
    assert "#SBATCH --requeue" in line
    assert cluster.requeue_slurm_job({}) == (False, "not requeued: SLURM_JOB_ID is not set (not a SLURM job)")
