"""A rank that dies (SIGKILL), raises, or hangs mid-step: the survivors stop with an error naming it, within the
collective timeout; under `fleetlite launch` the launcher exits non-zero and no worker is left behind.

Detection times are printed (run with -s); they feed the README's reliability table, and are never asserted.
"""

from __future__ import annotations

import time

import pytest
from faults_helpers import RECIPE_ARGS, WRAPPER, alive, fit_with_fault, launch_env

from fleetlite.testing import run_launch, run_ranks


def _survivor(out, victim):
    survivor = 1 - victim
    assert out[survivor][0] == "ok", out[survivor]
    result = out[survivor][1]
    assert result is not None, "training finished although a rank was lost"
    return result


@pytest.mark.timeout(60)
@pytest.mark.parametrize("victim", [1, 0])  # rank 0 also serves the store outside torchrun
def test_sigkilled_rank_is_named_by_the_survivor(tmp_path, victim):
    stamp = tmp_path / "killed-at"
    out = run_ranks(fit_with_fault, args=(victim, "kill", str(stamp)), expect_failure=True, timeout=50,
                    env={"FLEETLITE_COLLECTIVE_TIMEOUT": "30"})
    assert out[victim][0] == "error" and "code -9" in out[victim][1]
    name, message, lost, caught = _survivor(out, victim)
    assert name == "CollectiveError" and lost == {victim: "died"}
    assert f"training failed on rank {1 - victim} of 2: rank {victim} died: its process (pid " in message
    assert "is gone (killed" in message and "FLEETLITE_COLLECTIVE_TIMEOUT" in message and "(30 s)" in message
    print(f"\n[detect] SIGKILL of rank {victim}: survivor raised {caught - float(stamp.read_text()):.2f} s later")


@pytest.mark.timeout(60)
def test_rank_raising_mid_step_is_named_with_its_error(tmp_path):
    stamp = tmp_path / "raised-at"
    out = run_ranks(fit_with_fault, args=(1, "raise", str(stamp)), expect_failure=True, timeout=50)
    assert out[1][0] == "ok" and out[1][1][0] == "ValueError"  # the failing rank sees its own error
    name, message, lost, caught = _survivor(out, 1)
    assert name == "CollectiveError" and lost == {1: "raised"}
    assert "rank 1 raised ValueError: boom: a fault injected by the test (pid " in message
    print(f"\n[detect] exception on rank 1: survivor raised {caught - float(stamp.read_text()):.2f} s later")


@pytest.mark.timeout(60)
def test_hung_rank_is_named_after_the_collective_timeout(tmp_path):
    stamp = tmp_path / "stopped-at"
    out = run_ranks(fit_with_fault, args=(1, "stop", str(stamp)), expect_failure=True, timeout=50,
                    env={"FLEETLITE_COLLECTIVE_TIMEOUT": "3"})
    name, message, lost, caught = _survivor(out, 1)
    assert name == "CollectiveError" and lost == {1: "silent"}
    assert "rank 1 is alive (pid " in message and "but did not answer: hung, or far behind" in message
    assert "Timed out" in message and "(3 s)" in message
    print(f"\n[detect] SIGSTOP of rank 1 (timeout 3 s): survivor raised {caught - float(stamp.read_text()):.2f} s "
          "later")


@pytest.mark.timeout(120)
def test_launch_exits_non_zero_naming_the_killed_rank_and_leaves_no_process(tmp_path):
    start = time.time()
    proc = run_launch(["--nproc_per_node", "2", str(WRAPPER), *RECIPE_ARGS, f"run_dir={tmp_path / 'run'}"],
                      timeout=100, cwd=str(tmp_path),
                      env=launch_env(FAULT="kill", FAULT_RANK="1", FAULT_STEP="5", FAULT_DIR=str(tmp_path)))
    ended = time.time()
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: training failed on rank 0 of 2: rank 1 died: its "
                                                     "process (pid "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr  # one line from the survivor, no stack
    assert "fleetlite launch: a worker failed" in proc.stderr and "Signal 9 (SIGKILL)" in proc.stderr
    pids = [int((tmp_path / f"pid-{r}").read_text()) for r in (0, 1)]
    assert not [p for p in pids if alive(p)], "a worker outlived the launcher"
    killed = float((tmp_path / "killed-at").read_text())
    caught = float((tmp_path / "caught-at-0").read_text())
    assert start < killed < caught < ended
    print(f"\n[detect] launch, SIGKILL of rank 1: rank 0 raised {caught - killed:.2f} s later, launcher exited "
          f"{ended - killed:.2f} s later")
