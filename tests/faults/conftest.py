"""The uninterrupted 2-rank recipe run every fault-tolerance run is compared with (once per session)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from faults_helpers import RECIPE_ARGS, WRAPPER, launch_env
from filelock import FileLock  # a dependency of torch

from fleetlite.testing import run_launch


def _launch_straight(base: Path) -> Path:
    proc = run_launch(["--nproc_per_node", "2", str(WRAPPER), *RECIPE_ARGS, f"run_dir={base / 'run'}"],
                      timeout=150, cwd=str(base), env=launch_env(FAULT_DIR=str(base)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "run"


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory, worker_id):
    """``fleetlite launch --nproc_per_node 2`` of the recipe on tiny synthetic data, no fault: its run directory.

    Read only by the tests, so under xdist the workers share one run (pytest-xdist's documented pattern: a
    directory beside the workers' base temps, built under a file lock by the first worker that asks)."""
    if worker_id == "master":
        return _launch_straight(tmp_path_factory.mktemp("straight"))
    root = tmp_path_factory.getbasetemp().parent  # this session's, shared by its workers
    base, done = root / "straight", root / "straight.done"
    with FileLock(str(root / "straight.lock")):
        if not done.exists():
            shutil.rmtree(base, ignore_errors=True)  # a worker's failed try: the recipe refuses a used run_dir
            base.mkdir()
            _launch_straight(base)
            done.touch()
    return base / "run"
