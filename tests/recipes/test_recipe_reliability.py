"""The recipe under the mistakes and failures a new user meets: one `error:` line each, the details in the run log.

Each runs recipes/cifar10.py in a subprocess on tiny synthetic data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fleetlite.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "cifar10.py"
FAULT_RECIPE = REPO / "tests" / "faults" / "fault_recipe.py"
TINY = ["data=synthetic", "data.train_size=128", "data.test_size=64", "trainer.epochs=2",
        "trainer.global_batch_size=32", "trainer.eval_batch_size=64", "trainer.callbacks.progress=false",
        "trainer.plot=false"]


def run(args: list[str], cwd: Path, script: Path = RECIPE, env: dict[str, str] | None = None, timeout: float = 240):
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    full_env.update(env or {})
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, cwd=cwd,
                          env=full_env, timeout=timeout)


def one_error_line(proc, status: int) -> str:
    assert proc.returncode == status, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


@pytest.mark.timeout(300)
def test_recompute_of_a_module_that_does_not_exist_is_one_line(tmp_path):
    proc = run([*TINY, "strategy=recompute", "strategy.recompute_configs.checkpoints=[nonexistent]",
                f"run_dir={tmp_path / 'run'}"], tmp_path)
    line = one_error_line(proc, 2)
    assert "strategy.recompute_configs.checkpoints: recompute checkpoint 'nonexistent' is not a submodule" in line
    assert "conv1" in line  # the names there are


@pytest.mark.timeout(300)
def test_tensorboard_without_the_package_is_one_line_before_training(tmp_path):
    shadow = tmp_path / "shadow" / "tensorboard"  # a tensorboard that fails to import, as a missing one does
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named tensorboard')\n")
    proc = run([*TINY, "trainer.callbacks.tensorboard=true", f"run_dir={tmp_path / 'run'}"], tmp_path,
               env={"PYTHONPATH": f"{shadow.parent}{os.pathsep}{REPO}"})
    line = one_error_line(proc, 2)
    assert "trainer.callbacks.tensorboard=true needs the tensorboard package" in line and "pip install" in line
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.timeout(300)
def test_a_diverging_run_stops_with_one_line_and_keeps_finite_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    proc = run([*TINY, "optim.lr=1e8", "sched=none", "trainer.save_steps=1", f"run_dir={run_dir}"], tmp_path)
    line = one_error_line(proc, 1)
    assert "non-finite loss" in line and "lower learning rate" in line
    ckpts = run_dir / "checkpoints"
    if (ckpts / "latest.pt").exists():
        model = load_checkpoint(ckpts / "latest.pt")["model"]
        assert all(torch.isfinite(v).all() for v in model.values() if v.is_floating_point())
    assert "final validation accuracy" not in proc.stdout


@pytest.mark.timeout(300)
def test_an_unexpected_exception_is_one_line_with_its_traceback_in_the_run_log(tmp_path):
    run_dir = tmp_path / "run"
    proc = run([*TINY, f"run_dir={run_dir}"], tmp_path, script=FAULT_RECIPE,
               env={"FAULT": "raise", "FAULT_RANK": "0", "FAULT_STEP": "2", "FAULT_DIR": str(tmp_path)})
    line = one_error_line(proc, 1)
    log = run_dir / "cifar10.log"
    assert line == f"error: ValueError: boom: a fault injected by the test (traceback in {log})"
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "boom" in text


@pytest.mark.timeout(300)
def test_the_run_log_holds_the_epoch_metrics_and_a_reused_run_dir_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    proc = run([*TINY, f"run_dir={run_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (run_dir / "cifar10.log").read_text().splitlines()
    epochs = [ln for ln in lines if "] - Epoch " in ln]
    assert [ln.split("] - ")[1].split(":")[0] for ln in epochs] == ["Epoch 0/1", "Epoch 1/1"], lines
    assert all("loss=" in ln and "val_acc=" in ln for ln in epochs)
    assert "Epoch 0/1: loss=" not in proc.stdout + proc.stderr  # the file only: the terminal has the progress bar

    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    again = run([*TINY, f"run_dir={run_dir}"], tmp_path)
    line = one_error_line(again, 2)
    assert f"run_dir={run_dir} already holds the checkpoints of an earlier run" in line and "resume=latest" in line
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before

    # item 11: resuming the finished run (an elastic restart after the last checkpoint) trains nothing, succeeds
    done = run([*TINY, f"run_dir={run_dir}", "resume=latest"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "final validation accuracy" in done.stdout and "Traceback" not in done.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
