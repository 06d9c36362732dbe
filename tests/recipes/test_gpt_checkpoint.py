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
