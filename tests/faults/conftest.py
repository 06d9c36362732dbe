"""The uninterrupted 2-rank recipe run every fault-tolerance run is compared with (once per session)."""

from __future__ import annotations

import pytest
from faults_helpers import RECIPE_ARGS, WRAPPER, launch_env

from fleetlite.testing import run_launch


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory):
    """``fleetlite launch --nproc_per_node 2`` of the recipe on tiny synthetic data, no fault: its run directory."""
    base = tmp_path_factory.mktemp("straight")
    proc = run_launch(["--nproc_per_node", "2", str(WRAPPER), *RECIPE_ARGS, f"run_dir={base / 'run'}"],
                      timeout=150, cwd=str(base), env=launch_env(FAULT_DIR=str(base)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "run"
