"""The CIFAR-10 recipe with strategy=sharding2 / sharding3 (async checkpoints): `make run`-sized, 2 processes."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlite.testing import run_launch

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "recipes" / "cifar10.py"
TINY = ["data=synthetic", "data.train_size=256", "data.test_size=128", "trainer.epochs=2",
        "trainer.global_batch_size=64", "trainer.eval_batch_size=64", "trainer.callbacks.progress=false"]


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _ok(proc) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.timeout(600)
def test_sharding2_and_sharding3_recipes_match_one_process(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ref = tmp_path / "ref"
    _ok(subprocess.run([sys.executable, str(RECIPE), *TINY, f"run_dir={ref}"], capture_output=True, text=True,
                       env=env, timeout=200))
    for option, extra in (("sharding2", []), ("sharding3", ["trainer.async_save=true"])):
        run_dir = tmp_path / option
        proc = run_launch(["--nproc_per_node", "2", str(RECIPE), *TINY, f"strategy={option}", *extra,
                           f"run_dir={run_dir}"], timeout=200, env={"OMP_NUM_THREADS": "1"})
        _ok(proc)
        ckpts = run_dir / "checkpoints"
        assert (ckpts / "latest").read_text() == "epoch-0001" and (ckpts / "epoch-0001" / ".metadata").is_file()
        for got, want in zip(_metrics(run_dir), _metrics(ref), strict=True):
            for k in want:
                assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), (option, k)
