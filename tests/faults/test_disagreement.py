"""Ranks that disagree (recipe config, Trainer config, model shapes, or a config bad on one rank only) fail fast,
before any training step, with a message showing the difference."""

from __future__ import annotations

import pytest
from faults_helpers import (
    RECIPE_ARGS,
    WRAPPER,
    fit_with_agreed_config,
    fit_with_own_config,
    fit_with_own_width,
    launch_env,
)

from fleetlite.distributed.agreement import differences
from fleetlite.testing import run_launch, run_ranks


@pytest.mark.timeout(90)
@pytest.mark.parametrize("override, expected", [
    # every rank reads its own LOCAL_RANK: the composed configs differ
    ("seed=${oc.env:LOCAL_RANK}", "error: recipe config differs across ranks (seed: rank 0 has 0, rank 1 has 1). "
                                  "Every rank must use the same recipe config; run every rank with the same command "
                                  "line, the same conf/ files and the same values of the environment variables the "
                                  "config reads."),
    # valid on rank 0 (0.0), out of range on rank 1 (1.0): rank 1's error stops everyone
    ("trainer.label_smoothing=${oc.env:LOCAL_RANK}", "error: on rank 1: trainer.label_smoothing=1.0 must be in [0, 1)"),
])
def test_recipe_ranks_with_different_configs_stop_before_training(tmp_path, override, expected):
    proc = run_launch(["--nproc_per_node", "2", str(WRAPPER), *RECIPE_ARGS, override, f"run_dir={tmp_path / 'run'}"],
                      timeout=80, cwd=str(tmp_path), env=launch_env(FAULT_DIR=str(tmp_path)))
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [expected], proc.stderr[-3000:]
    assert not (tmp_path / "run").exists() and not (tmp_path / "pid-0").exists()  # nothing started


@pytest.mark.timeout(60)
def test_model_shapes_differing_across_ranks_fail_on_every_rank_before_a_step():
    out = run_ranks(fit_with_own_width, timeout=50)
    for name, message, steps in out:
        assert name == "ValueError" and steps == 0
        assert ("the model differs across ranks at parameter #0 ('0.weight'): rank 0 has '0.weight' shape (16, 6) "
                "float32, rank 1 has '0.weight' shape (12, 6) float32") in message


@pytest.mark.timeout(60)
def test_trainer_configs_differing_across_ranks_fail_on_every_rank_before_a_step():
    out = run_ranks(fit_with_own_config, timeout=50)
    for name, message, steps in out:
        assert name == "RankMismatchError" and steps == 0
        assert message.startswith("Trainer config differs across ranks (seed: rank 0 has 0, rank 1 has 1)")


@pytest.mark.timeout(60)
def test_a_config_the_recipe_preflight_agreed_is_not_compared_again():
    out = run_ranks(fit_with_agreed_config, timeout=50)
    assert [steps for steps, _ in out] == [out[0][0]] * 2 and out[0][0] > 0
    assert {kind for _, kind in out} == {"dict"}


def test_differences_lists_changed_added_and_removed_keys():
    a = {"optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "layers": [{"w": 1}, {"w": 2}], "seed": 0}
    b = {"optim": {"lr": 0.2, "betas": [0.9, 0.99]}, "layers": [{"w": 1}, {"w": 3}], "extra": True}
    assert differences(a, b) == [("optim.lr", 0.1, 0.2), ("layers.1.w", 2, 3), ("seed", 0, "<absent>"),
                                 ("extra", "<absent>", True)]
    assert differences(a, a) == []
