"""Elastic restart: `fleetlite launch --max_restarts N ... resume=auto` restarts the worker group after a rank dies,
in the SAME run directory (the default one included), from the newest checkpoint, and ends bit-identical to an
uninterrupted run. Jobs whose restarts could not find their checkpoints are refused before training."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from faults_helpers import RECIPE_ARGS, WRAPPER, assert_bit_identical, final_model, launch_env

from fleetlite.distributed.launch import LAUNCH_TIME_VAR
from fleetlite.recipe import schema
from fleetlite.recipe.job import EXIT_CONFIG, plan
from fleetlite.recipe.validate import ConfigError, check_restartable
from fleetlite.testing import run_launch

CONF = Path(__file__).resolve().parents[2] / "conf"
DEFAULT_RUN_DIR = "outputs/${launch_time:%Y-%m-%d}/${launch_time:%H-%M-%S}"


@pytest.mark.timeout(150)
def test_restart_after_a_killed_rank_resumes_in_the_same_default_run_dir_bit_identical(tmp_path, straight_run):
    # rank 1 dies before step 12 in the first attempt; checkpoints every 3 steps: the restart resumes after step 9
    proc = run_launch(["--nproc_per_node", "2", "--max_restarts", "1", str(WRAPPER), *RECIPE_ARGS, "resume=auto"],
                      timeout=140, cwd=str(tmp_path),
                      env=launch_env(FAULT="kill", FAULT_RANK="1", FAULT_STEP="11", FAULT_DIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "killed-at").exists()
    made = sorted(tmp_path.glob("outputs/*/*"))
    assert len(made) == 1, f"the restart must land in the first attempt's run directory, got {made}"
    run_dir = made[0]
    assert f"elastic restart 1: resuming from {run_dir}/checkpoints/latest.pt" in proc.stdout
    assert "error: training failed on rank 0 of 2: rank 1 died" in proc.stderr  # the first attempt's survivor
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["epoch-0000.pt", "epoch-0001.pt", "latest.pt", "step-00000003.pt", "step-00000006.pt",
                     "step-00000009.pt", "step-00000012.pt", "step-00000015.pt"]
    assert_bit_identical(final_model(run_dir), final_model(straight_run))
    assert (run_dir / "metrics.csv").read_text() == (straight_run / "metrics.csv").read_text()


def test_restartable_run_dir_rules():
    fleet = {"TORCHELASTIC_MAX_RESTARTS": "3", LAUNCH_TIME_VAR: "1700000000.5", "WORLD_SIZE": "2",
             "LOCAL_WORLD_SIZE": "2"}
    assert check_restartable("auto", DEFAULT_RUN_DIR, fleet) is None  # fleetlite launch: one dir for all restarts
    assert check_restartable("auto", "outputs/job", {"TORCHELASTIC_MAX_RESTARTS": "3"}) is None
    assert check_restartable("auto", DEFAULT_RUN_DIR, {}) is None  # no restarts: nothing to keep
    plain_torchrun = {k: v for k, v in fleet.items() if k != LAUNCH_TIME_VAR}
    with pytest.raises(ConfigError, match=r"resume=auto with --max_restarts 3: run_dir=outputs/\$\{launch_time.* "
                                          "plain torchrun does not keep across restarts.*set run_dir=outputs/"):
        check_restartable("auto", DEFAULT_RUN_DIR, plain_torchrun)
    with pytest.raises(ConfigError, match=r"follows the current time \(\$\{now:...\}\)"):
        check_restartable("latest", "outputs/${now:%H-%M-%S}", fleet)
    with pytest.raises(ConfigError, match="on several nodes"):
        check_restartable("auto", DEFAULT_RUN_DIR, dict(fleet, WORLD_SIZE="4"))
    assert "a restarted worker group trains from scratch; add resume=auto" in check_restartable(None, "x", fleet)
    assert "every restart resumes from that same file" in check_restartable("/ckpt/a.pt", "x", fleet)


def test_preflight_refuses_a_plain_torchrun_elastic_job_with_the_default_run_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["cifar10.py"])
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.delenv(LAUNCH_TIME_VAR, raising=False)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as info:
        plan(CONF, "cifar10", ["data=synthetic", "resume=auto"])
    assert info.value.code == EXIT_CONFIG
    assert "plain torchrun does not keep across restarts" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(LAUNCH_TIME_VAR, "1700000000.5")  # as under fleetlite launch: the launch time, pinned
    (job,) = plan(CONF, "cifar10", ["data=synthetic", "resume=auto"])
    assert job.cfg.run_dir == f"outputs/{schema.launch_time('%Y-%m-%d')}/{schema.launch_time('%H-%M-%S')}"
    assert schema.LAUNCH_TIME_VAR == LAUNCH_TIME_VAR


def test_launch_time_is_the_launchers_time_when_set(monkeypatch):
    import datetime

    monkeypatch.setenv(LAUNCH_TIME_VAR, "1700000000.5")
    want = datetime.datetime.fromtimestamp(1700000000.5)
    assert schema.launch_time("%Y-%m-%d %H:%M:%S") == want.strftime("%Y-%m-%d %H:%M:%S")
    monkeypatch.delenv(LAUNCH_TIME_VAR)
    first = schema.launch_time("%H-%M-%S.%f")
    assert schema.launch_time("%H-%M-%S.%f") == first  # one time per process, not "now" at each call
