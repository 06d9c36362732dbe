"""mp=2 x pp=2 on 4 ranks: tensor-parallel layers inside pipeline stages equal a single process (AdamW steps)."""

import pytest
import torch
from hybrid_models import (
    LM_MICRO,
    LM_ROWS,
    TP_VOCAB,
    copy_from,
    init_fleet,
    lm_descs,
    lm_loss,
    lm_reference,
    local_slice,
    run_cases,
)
from parity import max_abs_diff, worst

from fleetlite.distributed import fleet
from fleetlite.distributed.fleet.meta_parallel import PipelineLayer, is_split
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

STEPS = 4


def _mp_pp(rank, world, clip=None):
    hcg = init_fleet({"dp_degree": 1, "mp_degree": 2, "pp_degree": 2},
                     {"accumulate_steps": LM_ROWS // LM_MICRO, "micro_batch_size": LM_MICRO})
    ref = lm_reference()  # trained below by a plain loop on the whole batch
    stage = PipelineLayer(lm_descs(), topology=hcg.topology(), loss_fn=lm_loss)
    copy_from(stage, ref, hcg)
    ref_params = dict(ref.named_parameters())
    assert any(is_split(p) for p in stage.parameters())  # the stage really holds tensor-parallel slices
    model = fleet.distributed_model(stage)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    if clip is not None:
        opt._grad_clip = ClipGradByGlobalNorm(clip)  # Paddle's grad_clip= on a plain optimizer
    d_loss = []
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        x = torch.randint(0, TP_VOCAB, (LM_ROWS, 5), generator=g)
        y = torch.randint(0, TP_VOCAB, (LM_ROWS, 5), generator=g)
        loss = model.train_batch([x, y], opt)
        ref_opt.zero_grad()
        ref_loss = lm_loss(ref(x), y)
        ref_loss.backward()
        if clip is not None:
            assert torch.nn.utils.clip_grad_norm_(ref.parameters(), clip) > 2 * clip  # the clip does act
        ref_opt.step()
        d_loss.append(abs(loss.item() - ref_loss.item()))
    d_param = worst(max_abs_diff(p, local_slice(ref_params[n], p, hcg)) for n, p in stage.named_parameters())
    return worst(d_loss), d_param


CLIPS = (None, 0.05)


@pytest.fixture(scope="module")
def mp_pp():
    """Every rank's results of both runs, without a clip and with one (keys: the clip): one 4-rank launch for the
    module."""
    return run_ranks(run_cases, world_size=4, args=({clip: (_mp_pp, (clip,), {}) for clip in CLIPS},), timeout=400)


@pytest.mark.timeout(500)
@pytest.mark.parametrize("clip", CLIPS)
def test_mp2_pp2_equals_single_process(clip, mp_pp):
    """With ``clip``: the global norm counts each slice once across mp and each stage's parameters once."""
    for out in mp_pp:
        d_loss, d_param = out[clip]
        assert d_loss < 1e-5 and d_param < 1e-5
