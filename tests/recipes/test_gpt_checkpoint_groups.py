"""`fleetlite run gpt` checkpoints of the parallel plan's newer groups (sep2, pp2_vpp2, mp2_stage3): resumed on
their own degrees and resharded (Note [gpt checkpoints]); split from test_gpt_checkpoint.py (its docstring holds
the reference) so that xdist's loadfile spreads the launches. Both tests share the uninterrupted runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_gpt_checkpoint import TINY, run, step_dir

import fleetlite.checkpoint as ckpt


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
