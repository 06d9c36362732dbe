"""`fleetlite run gpt` checkpoints and resumes (Note [gpt checkpoints]) on 2 ranks with hybrid=mp2 and pp2.

The checkpoints are the Trainer's (``ModelCheckpoint``): with ``train.save_steps=2`` epoch e of the recipe ends
after step 2 (e + 1), so ``checkpoints/epoch-0000`` is step 2's and ``epoch-0001`` step 4's.

Reference: the uninterrupted run of the same config. A run stopped after step 2 (its checkpoint) and resumed with
``resume=true`` prints the same losses for steps 3-4 and the same final eval loss, and its step-4 checkpoint holds
weights ``torch.equal`` to the uninterrupted run's. The mp2 checkpoint also resumes in one process (resharded),
and across pipeline layouts (pp2 -> one process, pp2 -> mp2, mp2 -> pp2): the losses then agree with the
uninterrupted run within float rounding (1e-4). The parallel plan's newer groups (sep2, pp2_vpp2, mp2_stage3) resume
on their own degrees alike, and reshard: mp2_stage3 -> one process, one process -> mp2_stage3 (FSDP2 stage 3 beside
mp), pp2_vpp2 (two chunks per rank) -> pp2 (one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from test_gpt_recipe import fleetlite_run

import fleetlite.checkpoint as ckpt

TINY = ["train.steps=4", "model.width=64", "data.num_chars=20000", "train.eval_batches=2", "train.save_steps=2"]
STEP = re.compile(r"^step (\d+)/\d+ loss (\d+\.\d+) \| ", re.M)
FINAL = re.compile(r"^final eval loss: (\d+\.\d+)", re.M)


def step_dir(where: Path, step: int) -> Path:
    """The checkpoint of ``step`` in ``where/run`` (save_steps=2: the end of epoch step / 2 - 1)."""
    return where / "run" / "checkpoints" / f"epoch-{step // 2 - 1:04d}"


def run(args: list[str], where: Path, nproc: int) -> tuple[dict[int, str], str, str]:
    """(loss text by step, final eval loss text, stdout); ``run_dir`` is ``where/run``."""
    where.mkdir(parents=True, exist_ok=True)
    proc = fleetlite_run(args, where, nproc=nproc, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    final = FINAL.search(proc.stdout)
    assert final, proc.stdout
    return {int(s): v for s, v in STEP.findall(proc.stdout)}, final.group(1), proc.stdout


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """``uninterrupted(hybrid, nproc)``: the 4-step run of that group (cached for the module: its step-2 checkpoint
    is the one the resumes below start from) as (losses, final, its directory)."""
    runs: dict[str, tuple[dict[int, str], str, Path]] = {}

    def get(hybrid: str, nproc: int) -> tuple[dict[int, str], str, Path]:
        if hybrid not in runs:
            where = tmp_path_factory.mktemp(f"whole-{hybrid}")
            steps, final, _ = run([*TINY, f"hybrid={hybrid}"], where, nproc)
            assert sorted(steps) == [1, 2, 3, 4]
            runs[hybrid] = steps, final, where
        return runs[hybrid]

    return get


@pytest.mark.timeout(900)
@pytest.mark.parametrize("hybrid", ["mp2", "pp2"])
def test_resume_equals_the_uninterrupted_run(tmp_path, hybrid):
    whole, whole_final, _ = run([*TINY, f"hybrid={hybrid}"], tmp_path / "whole", 2)
    assert sorted(whole) == [1, 2, 3, 4]
    first, _, out = run([*TINY, f"hybrid={hybrid}", "train.steps=2"], tmp_path / "cut", 2)
    assert sorted(first) == [1, 2] and "checkpoints/epoch-0000" in out
    rest, final, out = run([*TINY, f"hybrid={hybrid}", "resume=true"], tmp_path / "cut", 2)
    assert "resuming from" in out and sorted(rest) == [3, 4]
    assert rest == {3: whole[3], 4: whole[4]} and final == whole_final
    saved = ckpt.load_full(step_dir(tmp_path / "whole", 4))
    resumed = ckpt.load_full(step_dir(tmp_path / "cut", 4))
    assert saved.keys() == resumed.keys() and len(saved) > 10
    for k, v in saved.items():
        assert torch.equal(resumed[k], v), k
    if hybrid == "mp2":  # the mp2 checkpoint in one process: DCP reshards the slices and the AdamW moments
        step2 = step_dir(tmp_path / "cut", 2)
        one, one_final, _ = run([*TINY, f"resume={step2}"], tmp_path / "one", 1)
        assert sorted(one) == [3, 4]
        assert float(one[4]) == pytest.approx(float(whole[4]), abs=1e-4)
        assert float(one_final) == pytest.approx(float(whole_final), abs=1e-4)


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


@pytest.mark.timeout(900)
@pytest.mark.parametrize("nproc, hybrid", [(2, "sep2"), (2, "pp2_vpp2"), (4, "mp2_stage3")])
def test_new_groups_resume_equal_the_uninterrupted_run(tmp_path, uninterrupted, nproc, hybrid):
    """sep2 (Ulysses), pp2_vpp2 (interleaved 1F1B, two chunks per rank) and mp2_stage3 (FSDP2 over the sharding
    axis beside mp): the uninterrupted run's step-2 checkpoint resumed on the same degrees prints the same losses
    and final eval loss, and its step-4 checkpoint holds the same weights bit for bit."""
    whole, whole_final, saved_in = uninterrupted(hybrid, nproc)
    rest, final, out = run([*TINY, f"hybrid={hybrid}", f"resume={step_dir(saved_in, 2)}"], tmp_path, nproc)
    assert "resuming from" in out and sorted(rest) == [3, 4], out
    assert rest == {3: whole[3], 4: whole[4]} and final == whole_final, (rest, final, whole, whole_final)
    saved = ckpt.load_full(step_dir(saved_in, 4))
    resumed = ckpt.load_full(step_dir(tmp_path, 4))
    assert saved.keys() == resumed.keys() and len(saved) > 10
    for k, v in saved.items():
        assert torch.equal(resumed[k], v), k


@pytest.mark.timeout(1200)
def test_new_group_checkpoints_reshard(tmp_path, uninterrupted):
    """mp2_stage3 -> one process and one process -> mp2_stage3 (each stage-3 shard of a slice is a piece of the
    full tensor in the checkpoint, the AdamW moments alike), pp2_vpp2 -> pp2 (the chunks' layers by global index):
    steps 3-4 and the final eval loss agree with the uninterrupted one-process run within float rounding (1e-4)."""
    whole, whole_final, _ = uninterrupted("none", 1)
    cases = [("mp2_stage3", 4, 1, []), ("pp2_vpp2", 2, 2, ["hybrid=pp2"]), ("none", 1, 4, ["hybrid=mp2_stage3"])]
    for saved, saved_nproc, nproc, args in cases:
        source = uninterrupted(saved, saved_nproc)[2]
        where = tmp_path / f"{saved}-to-{nproc}-{'-'.join(a.split('=')[1] for a in args)}"
        rest, final, out = run([*TINY, *args, f"resume={step_dir(source, 2)}"], where, nproc)
        assert "resuming from" in out and sorted(rest) == [3, 4], out
        for s in (3, 4):
            assert float(rest[s]) == pytest.approx(float(whole[s]), abs=1e-4), (saved, args, s, rest, whole)
        assert float(final) == pytest.approx(float(whole_final), abs=1e-4), (saved, args, final, whole_final)
