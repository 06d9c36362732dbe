"""Hybrid checkpoints written on 4 ranks with dp = 2 (dp2 x mp2 through ``fit``, dp2 x pp2 through ``train_batch``)
load into dp = 4 (the single-process twin under data parallel over the 4 ranks). Reference: the full weights of
the saved model, gathered when it was saved (``torch.equal``). Also: ``PipelineParallel.agree_buffers`` agrees a
stage's buffers over its data-parallel group only (the other stage has none: over the world it would hang)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hybrid_models import RefNet, batches, init_fleet, pp_steps, pp_trainer, single_pipe_trainer, tp_trainer

from fleetlite.testing import run_ranks


def _save_then_load_on_dp4(rank, world, root):
    root = Path(root)
    t = tp_trainer(mp=2, dp=2)
    t.fit(batches(), epochs=1, save_dir=root / "mp", verbose=0)
    tp_saved = t.get_weights()
    t = pp_trainer(dp=2)
    pp_steps(t, 0, 2)
    t.save(root / "pp")
    pp_saved = t.get_weights()
    stage = t.parallel_network.stage_id
    if stage == 1:  # a buffer on the last stage only: agreed over its data-parallel group, never over the world
        t.network.register_buffer("mark", torch.full((2,), float(rank)))
    t.parallel_network.agree_buffers()
    mark = t.network.mark.tolist() if stage == 1 else None

    t = tp_trainer(mp=1, dp=4)  # (re-initialises fleet with dp = 4)
    t.load(root / "mp" / "epoch-0000")
    tp_loaded = t.get_weights()
    init_fleet(dp=4)
    t = single_pipe_trainer()
    t.load(root / "pp")
    return tp_saved, tp_loaded, pp_saved, t.get_weights(), type(t.parallel_network).__name__, (stage, mark)


@pytest.mark.timeout(600)
def test_dp2_checkpoints_load_into_dp4(tmp_path):
    out = run_ranks(_save_then_load_on_dp4, world_size=4, args=(str(tmp_path),), timeout=500)
    tp_saved, _, pp_saved, _, _, _ = out[0]
    assert tp_saved.keys() == RefNet().state_dict().keys()
    # dp2 x pp2: ranks 0, 2 are stage 0 and ranks 1, 3 stage 1; rank 3's buffer became its replica rank 1's
    assert [o[5] for o in out] == [(0, None), (1, [1.0, 1.0]), (0, None), (1, [1.0, 1.0])]
    for _tp, tp_loaded, _pp, pp_loaded, wrapper, _ in out:
        assert wrapper == "DataParallel"
        for k, v in tp_saved.items():
            assert torch.equal(tp_loaded[k], v), k
        assert pp_loaded.keys() == pp_saved.keys()
        for k, v in pp_saved.items():
            assert torch.equal(pp_loaded[k], v), k
