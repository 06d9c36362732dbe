"""`fleetlite run gpt` on the parallel plan's groups equals the one-process run (the reference and its tolerance:
test_gpt_recipe.py's docstring); split from test_gpt_recipe.py so that xdist's loadfile spreads the launches."""

from __future__ import annotations

import pytest
import test_gpt_recipe
from test_gpt_recipe import TINY, fleetlite_run, losses, one_process_flops_per_token

reference = test_gpt_recipe.reference  # the one-process run (a module fixture: run once for this module too)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("hybrid", ["dp2_mp2", "dp2_pp2", "mp2_pp2"])
def test_four_rank_groups_equal_one_process(reference, tmp_path, hybrid):
    proc = fleetlite_run([*TINY, f"hybrid={hybrid}"], tmp_path, nproc=4, timeout=400)
    steps, final = losses(proc)
    assert steps == pytest.approx(reference[0], abs=1e-4)
    assert final == pytest.approx(reference[1], abs=1e-4)
    assert f"{one_process_flops_per_token():,} FLOPs per token" in proc.stdout  # the whole model's, not a slice's
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if "epoch" in p.name or "latest" in p.name or
                  "checkpoints" in p.name) == []  # no train.save_steps: no checkpoint


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nproc, hybrid", [(2, "sep2"), (2, "pp2_vpp2"), (4, "mp2_stage3")])
def test_segment_interleaved_and_stage3_beside_mp_groups_equal_one_process(reference, tmp_path, nproc, hybrid):
    """The parallel plan's newer layouts: sep2 (Ulysses all-to-all around attention), two virtual stages per
    pipeline rank (interleaved 1F1B), FSDP2 stage 3 sharding the tensor-parallel slices."""
    steps, final = losses(fleetlite_run([*TINY, f"hybrid={hybrid}"], tmp_path, nproc=nproc, timeout=400))
    assert steps == pytest.approx(reference[0], abs=1e-4)
    assert final == pytest.approx(reference[1], abs=1e-4)
