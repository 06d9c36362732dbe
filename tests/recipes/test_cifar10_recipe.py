"""The CIFAR-10 recipe end to end on tiny synthetic data: 1 and 2 processes, resume, multirun, bad input.

References: the 2-process run must reproduce the 1-process run (same global
batch, same sample order and augmentation, gradients averaged), and a run
stopped mid-epoch and resumed must reproduce the uninterrupted run.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlite.testing import run_launch

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "cifar10.py"
TINY = ["data=synthetic", "data.train_size=256", "data.test_size=128", "trainer.epochs=2",
        "trainer.global_batch_size=64", "trainer.eval_batch_size=64"]
QUIET = ["trainer.callbacks.progress=false"]
FINAL = re.compile(r"final validation accuracy: (\d\.\d{4}) \(loss (\d+\.\d{4})\)")


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1")


def run_recipe(args: list[str], cwd: Path = REPO, cli: bool = False, timeout: float = 150):
    cmd = [sys.executable, "-m", "fleetlite.cli", "run", "cifar10"] if cli else [sys.executable, str(RECIPE)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=cwd, env=_env(), timeout=timeout)


def _ok(proc) -> None:
    assert proc.returncode == 0, (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                                  f"stderr:\n{proc.stderr[-3000:]}")


def read_csv(path: Path) -> list[dict[str, float]]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def assert_same_metrics(got: list[dict], ref: list[dict], rel: float = 1e-4) -> None:
    assert [r["epoch"] for r in got] == [r["epoch"] for r in ref]
    for g, r in zip(got, ref):
        assert g.keys() == r.keys()
        for k in r:
            assert g[k] == pytest.approx(r[k], rel=rel, abs=1e-6), (k, g, r)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, two epochs: the run every other run is compared with."""
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    proc = run_recipe([*TINY, f"run_dir={run_dir}"])
    _ok(proc)
    return run_dir, proc


@pytest.mark.timeout(200)
def test_one_process_leaves_a_complete_run_directory(reference):
    run_dir, proc = reference
    rows = read_csv(run_dir / "metrics.csv")
    assert [r["epoch"] for r in rows] == [0, 1]
    assert {"acc", "loss", "val_acc", "val_loss"} <= rows[0].keys()
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / ".hydra" / "overrides.yaml").is_file()
    assert (run_dir / "checkpoints" / "latest.pt").is_file()
    if importlib.util.find_spec("matplotlib") is not None:
        png = run_dir / "training_curves.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"training curves: {png}" in proc.stdout
    acc, loss = FINAL.search(proc.stdout).groups()
    # the final evaluation sees the same model and test split as the last epoch's validation
    assert float(acc) == pytest.approx(rows[-1]["val_acc"], abs=1e-4)
    assert float(loss) == pytest.approx(rows[-1]["val_loss"], abs=1e-4)
    assert f"run directory: {run_dir}" in proc.stdout


@pytest.mark.timeout(200)
def test_two_processes_share_one_default_run_directory_and_match_one_process(reference, tmp_path):
    proc = run_launch(["--nproc_per_node", "2", str(RECIPE), *TINY], timeout=180, cwd=str(tmp_path),
                      env={"OMP_NUM_THREADS": "1"})
    _ok(proc)
    made = sorted(p for p in (tmp_path / "outputs").glob("*/*"))
    assert len(made) == 1, f"expected ONE run directory (outputs/<date>/<time>), got {made}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]
    run_dir = made[0]
    assert len(FINAL.findall(proc.stdout)) == 1  # rank 0 alone reports
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "checkpoints" / "latest.pt").is_file()
    assert_same_metrics(read_csv(run_dir / "metrics.csv"), read_csv(reference[0] / "metrics.csv"))


@pytest.mark.timeout(200)
def test_resume_latest_continues_a_stopped_run_exactly(reference, tmp_path):
    run_dir = tmp_path / "run"
    # resume=auto with nothing to resume is a fresh start; max_steps=6 stops it in epoch 2 (4 steps per epoch)
    first = run_recipe([*TINY, *QUIET, f"run_dir={run_dir}", "trainer.max_steps=6", "resume=auto"])
    _ok(first)
    assert [r["epoch"] for r in read_csv(run_dir / "metrics.csv")] == [0]
    second = run_recipe([*TINY, *QUIET, f"run_dir={run_dir}", "resume=latest"])
    _ok(second)
    assert_same_metrics(read_csv(run_dir / "metrics.csv"), read_csv(reference[0] / "metrics.csv"))


@pytest.mark.timeout(200)
def test_multirun_with_two_values_through_fleetlite_run(tmp_path):
    run_dir = tmp_path / "sweep"
    proc = run_recipe(["-m", *TINY, *QUIET, "trainer.epochs=1", f"run_dir={run_dir}", "optim.lr=0.01,0.002"],
                      cli=True)
    _ok(proc)
    assert (run_dir / "multirun.yaml").is_file()
    for job, lr in (("0", "0.01"), ("1", "0.002")):
        assert f"lr: {lr}\n" in (run_dir / job / ".hydra" / "config.yaml").read_text()
        assert len(read_csv(run_dir / job / "metrics.csv")) == 1
    assert len(FINAL.findall(proc.stdout)) == 2


@pytest.mark.timeout(120)
def test_bad_override_exits_2_with_one_line_before_anything_is_written(tmp_path):
    proc = run_recipe(["data=synthetic", "trainer.epochs=abc"], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("error: trainer.epochs=abc: ") and "Integer" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(120)
def test_batch_smaller_than_ranks_fails_on_every_rank_with_one_line(tmp_path):
    proc = run_launch(["--nproc_per_node", "2", str(RECIPE), "data=synthetic", "trainer.global_batch_size=1"],
                      timeout=100, cwd=str(tmp_path), env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: trainer.global_batch_size=1 is smaller than the number of ranks (2): it is the global "
                      "batch, split across ranks, so every rank would get none; "
                      "set trainer.global_batch_size=2 or more"]
    assert not (tmp_path / "outputs").exists()
