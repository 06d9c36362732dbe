"""`fleetlite run gpt` checkpoints across layouts and resume mistakes (Note [gpt checkpoints]); split from
test_gpt_checkpoint.py (its docstring holds the reference) so that xdist's loadfile spreads the launches."""

from __future__ import annotations

import pytest
from test_gpt_checkpoint import TINY, run, step_dir
from test_gpt_recipe import fleetlite_run


@pytest.mark.timeout(400)
def test_resume_mistakes_are_one_line(tmp_path):
    one = ["train.steps=2", "model.width=64", "data.num_chars=20000", "train.eval_batches=1", "train.save_steps=2"]
    run(one, tmp_path, 1)
    proc = fleetlite_run([*one, "resume=latest", "train.steps=1"], tmp_path, nproc=1)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "past train.steps=1" in errors[0], proc.stderr[-2000:]
    proc = fleetlite_run([*one, "resume=latest", "train.save_steps=1"], tmp_path, nproc=1)  # other epochs
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "train.save_steps" in errors[0], proc.stderr[-2000:]
    proc = fleetlite_run(one, tmp_path, nproc=1)  # a fresh run over the checkpoints: refused before it starts
    assert proc.returncode == 2 and "resume" in proc.stderr, proc.stderr[-2000:]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    proc = fleetlite_run([*one, "resume=latest"], fresh, nproc=1)  # nothing to continue from
    assert proc.returncode == 2 and "holds no checkpoint" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.timeout(1200)
def test_checkpoints_reshard_across_pipeline_layouts(tmp_path):
    """A pp2 checkpoint resumes in one process and on mp2, an mp2 checkpoint on pp2 (Note [gpt names]: one state
    dict for every layout): steps 3-4 and the final eval loss agree with the uninterrupted one-process run within
    float rounding (1e-4)."""
    whole, whole_final, _ = run([*TINY], tmp_path / "whole", 1)
    cases = {"pp2": [(1, []), (2, ["hybrid=mp2"])], "mp2": [(2, ["hybrid=pp2"])]}
    for saved, resumes in cases.items():
        run([*TINY, f"hybrid={saved}", "train.steps=2"], tmp_path / saved, 2)
        step2 = step_dir(tmp_path / saved, 2)
        for nproc, args in resumes:
            where = tmp_path / f"{saved}-to-{nproc}-{'-'.join(a.split('=')[1] for a in args)}"
            rest, final, out = run([*TINY, *args, f"resume={step2}"], where, nproc)
            assert "resuming from" in out and sorted(rest) == [3, 4], out
            for s in (3, 4):
                assert float(rest[s]) == pytest.approx(float(whole[s]), abs=1e-4), (saved, args, s, rest, whole)
            assert float(final) == pytest.approx(float(whole_final), abs=1e-4), (saved, args, final, whole_final)
