"""Config mistakes under `fleetlite run --nproc_per_node N` and the recipe's batch rule.

Reference: the single-process run, which refuses a config mistake with ONE `error:` line and exit status 2; under
N ranks the answer must be the same line and status, whatever N (before, each rank failed and the launcher printed
one "a worker failed" line per rank, exit 1). A global batch that does not divide among the ranks is refused
(before, 3 on 2 ranks silently trained with 2).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from fleetlite.recipe.schema import register_configs
from fleetlite.recipe.validate import ConfigError, check_config

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
TINY = ["data=synthetic", "data.train_size=64", "data.test_size=32", "trainer.epochs=1",
        "trainer.callbacks.progress=false", "trainer.plot=false"]


def fleetlite_run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "fleetlite.cli", "run", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=150)


def refusal(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("fleetlite launch: warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [2, 4])
def test_a_config_mistake_is_one_line_and_exit_2_whatever_the_number_of_ranks(tmp_path, nproc):
    single = refusal(fleetlite_run(["cifar10", *TINY, "optim.lr=-1"], tmp_path))
    launched = refusal(fleetlite_run(["--nproc_per_node", str(nproc), "cifar10", *TINY, "optim.lr=-1"], tmp_path))
    assert launched == single
    assert single == "error: optim.lr=-1.0 must be a positive number (the learning rate); e.g. optim.lr=0.05"
    assert list(tmp_path.iterdir()) == []  # no worker started, nothing written


@pytest.mark.timeout(200)
def test_a_bad_run_dir_and_an_unknown_key_are_refused_before_the_workers_start(tmp_path):
    (tmp_path / "file").write_text("")
    line = refusal(fleetlite_run(["--nproc_per_node", "2", "cifar10", *TINY, f"run_dir={tmp_path}/file/run"],
                                 tmp_path))
    assert line.startswith(f"error: run_dir={tmp_path}/file/run is not writable")
    line = refusal(fleetlite_run(["--nproc_per_node", "2", "cifar10", *TINY, "trainer.epoch=3"], tmp_path))
    assert line.startswith("error: unknown key 'trainer.epoch'")


def _cfg(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("cifar10", overrides=list(overrides))


@pytest.mark.parametrize("batch, world, fix", [(3, 2, "e.g. 2 or 4"), (128, 3, "e.g. 126 or 129")])
def test_a_global_batch_that_does_not_divide_among_the_ranks_is_refused(batch, world, fix):
    with pytest.raises(ConfigError) as info:
        check_config(_cfg(f"trainer.global_batch_size={batch}"), world_size=world)
    text = str(info.value)
    assert text.startswith(f"trainer.global_batch_size={batch} does not divide among {world} ranks: ")
    assert f"so {batch} would train with {batch // world * world}" in text and text.endswith(fix)
    check_config(_cfg(f"trainer.global_batch_size={batch // world * world}"), world_size=world)  # a multiple is fine


def test_the_launcher_leaves_values_only_the_workers_can_resolve_to_them(monkeypatch):
    from fleetlite.recipe.job import check_command_line

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    per_rank = ["data=synthetic", "trainer.label_smoothing=${oc.env:LOCAL_RANK}"]
    assert check_command_line(CONF, "cifar10", per_rank, world_size=2) is None  # each worker checks its own value
    assert check_command_line(CONF, "cifar10", ["trainer.global_batch_size=3"], world_size=2).startswith(
        "trainer.global_batch_size=3 does not divide among 2 ranks")
