"""The package itself: light import, entry points, metadata the README's two commands rely on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torchvision", "hydra", "rich", "matplotlib")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.timeout(60)
def test_import_fleetlite_stays_light():
    probe = f"""
import json, sys
import fleetlite
after_top = sorted(m for m in {HEAVY!r} if m in sys.modules)
import fleetlite.distributed, fleetlite.testing
dist = fleetlite.distributed
after_dist = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps([after_top, after_dist, "torch" in sys.modules, callable(dist.init_parallel_env)]))
"""
    res = _python(probe)
    assert res.returncode == 0, res.stderr
    after_top, after_dist, torch_loaded, ok = json.loads(res.stdout.strip().splitlines()[-1])
    assert after_top == [], f"`import fleetlite` imported {after_top}; import them inside functions instead"
    assert after_dist == [], f"`import fleetlite.distributed` imported {after_dist}"
    assert torch_loaded and ok


def test_unknown_public_name_is_a_clear_attribute_error():
    import fleetlite

    with pytest.raises(AttributeError, match="has no attribute 'nonexistent'"):
        fleetlite.nonexistent  # noqa: B018


@pytest.mark.timeout(60)
def test_fleetlite_console_script_and_module_entry_points():
    exe = shutil.which("fleetlite", path=os.path.dirname(sys.executable))
    assert exe, "the `fleetlite` console script is missing: install the package (pip install -e .)"
    res = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "launch [torchrun options] SCRIPT" in res.stdout
    res = subprocess.run([exe, "frobnicate"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "unknown command 'frobnicate'" in res.stderr
    res = subprocess.run([sys.executable, "-m", "fleetlite.distributed.launch", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and "--nproc-per-node" in res.stdout and "--rdzv-endpoint" in res.stdout


def test_pyproject_declares_what_the_issue_asks():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["name"] == "fleetlite" and project["requires-python"] == ">=3.10"
    deps = {d.split(">")[0].split("=")[0].split("[")[0].strip(): d for d in project["dependencies"]}
    assert {"torch", "torchvision", "hydra-core", "rich"} <= set(deps)
    assert deps["hydra-core"].replace(" ", "").endswith(">=1.3")
    dev = " ".join(project["optional-dependencies"]["dev"])
    assert all(name in dev for name in ("pytest", "pytest-timeout", "ruff"))
    assert project["scripts"]["fleetlite"] == "fleetlite.cli:main"


def test_ci_entry_runs_make_test():
    ci = ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
    text = ci.read_text()
    assert "set -e" in text and "make test" in text
