"""The recipe resolves each thing once: a resume reads its checkpoint file once (chosen,
CRC-checked and loaded one time) and the config is composed once.

The recipe runs in a subprocess whose ``torch.load`` and ``ZipFile.testzip`` (the CRC pass) count the calls on
files under the watched folder, and whose Hydra counts its compositions; the preflight, the job's start and
``Trainer.fit`` share the one read, the preflight and the Hydra job the one composition.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "cifar10.py"
TINY = ["data=synthetic", "data.train_size=128", "data.test_size=64", "trainer.epochs=2",
        "trainer.global_batch_size=32", "trainer.eval_batch_size=64", "trainer.callbacks.progress=false",
        "trainer.plot=false"]

COUNTING = """
import atexit, json, os, runpy, sys, zipfile
import torch
from hydra._internal.hydra import Hydra

watched, counts = os.environ["WATCH_DIR"], {"torch.load": [], "crc": [], "compose": 0}
def note(kind, f):
    name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "filename", None) or getattr(f, "name", "")
    name = os.fspath(name)
    if os.path.abspath(name).startswith(watched):
        counts[kind].append(os.path.basename(name))
real_load, real_testzip = torch.load, zipfile.ZipFile.testzip
def load(f, *a, **k):
    note("torch.load", f)
    return real_load(f, *a, **k)
def testzip(self):
    note("crc", self)
    return real_testzip(self)
real_compose = Hydra.compose_config
def compose(self, *a, **k):
    counts["compose"] += 1
    return real_compose(self, *a, **k)
torch.load, zipfile.ZipFile.testzip, Hydra.compose_config = load, testzip, compose
atexit.register(lambda: open(os.environ["COUNT_FILE"], "w").write(json.dumps(counts)))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run(args: list[str], cwd: Path, counting: Path | None = None, watch: Path | None = None):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, str(RECIPE), *args]
    if counting is not None:
        env.update(COUNT_FILE=str(counting), WATCH_DIR=str(watch))
        cmd = [sys.executable, "-c", COUNTING, str(RECIPE), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=240)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run stopped in epoch 2 by max_steps=6: checkpoints to resume. Both tests resume from it (a copy each),
    so the recipe trains this start once per module rather than once per test."""
    base = tmp_path_factory.mktemp("stopped")
    _run([*TINY, f"run_dir={base / 'run'}", "trainer.max_steps=6"], base)
    assert (base / "run" / "checkpoints" / "latest.pt").is_file()
    return base / "run"


@pytest.mark.timeout(300)
def test_resume_latest_reads_the_checkpoint_once(stopped_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run, run_dir)  # this test's own copy: its resume writes more checkpoints there
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "latest.pt").is_file()

    counts = tmp_path / "counts.json"
    proc = _run([*TINY, f"run_dir={run_dir}", "resume=latest"], tmp_path, counting=counts, watch=ckpts)
    assert f"resuming from {ckpts}/latest.pt" in proc.stdout
    seen = json.loads(counts.read_text())
    # later saves write checkpoints but never read them back: only the resumed file is loaded, once
    assert seen == {"torch.load": ["latest.pt"], "crc": ["latest.pt"], "compose": 1}, seen


@pytest.mark.timeout(300)
def test_resume_from_a_named_file_reads_it_once(stopped_run, tmp_path):
    saved = tmp_path / "saved"
    saved.mkdir()
    ckpt = saved / "step6.pt"
    ckpt.write_bytes((stopped_run / "checkpoints" / "latest.pt").read_bytes())

    counts = tmp_path / "counts.json"
    _run([*TINY, f"run_dir={tmp_path / 'run2'}", f"resume={ckpt}"], tmp_path, counting=counts, watch=saved)
    assert json.loads(counts.read_text()) == {"torch.load": ["step6.pt"], "crc": ["step6.pt"], "compose": 1}
