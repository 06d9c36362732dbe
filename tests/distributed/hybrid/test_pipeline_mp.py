"""mp=2 x pp=2 on 4 ranks: tensor-parallel layers inside pipeline stages equal a single process (AdamW steps)."""

import pytest
import torch
import torch.nn.functional as F
from parity import max_abs_diff, worst
from torch import nn
from tp_models import VOCAB, WIDTH, local_slice

from fleetlite.distributed import fleet
from fleetlite.distributed.fleet.meta_parallel import (
    ColumnParallelLinear,
    LayerDesc,
    PipelineLayer,
    RowParallelLinear,
    VocabParallelEmbedding,
    is_split,
)
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

HIDDEN, ROWS, MICRO, STEPS = 12, 8, 2, 4


class TPBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = ColumnParallelLinear(WIDTH, HIDDEN, has_bias=True, gather_output=False)
        self.down = RowParallelLinear(HIDDEN, WIDTH, input_is_parallel=True)

    def forward(self, h):
        return h + self.down(F.gelu(self.up(h)))


class RefBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, h):
        return h + self.down(F.gelu(self.up(h)))


def _loss(logits, labels):
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten())


def _descs():
    return [LayerDesc(VocabParallelEmbedding, VOCAB, WIDTH), LayerDesc(TPBlock), LayerDesc(nn.LayerNorm, WIDTH),
            LayerDesc(ColumnParallelLinear, WIDTH, VOCAB, has_bias=False, gather_output=True)]


def _reference():
    """The same layers as a plain torch model (its parameter names are the stages' global layer indices)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), RefBlock(), nn.LayerNorm(WIDTH),
                         nn.Linear(WIDTH, VOCAB, bias=False))


def _mp_pp(rank, world, clip=None):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 2}
    strategy.pipeline_configs = {"accumulate_steps": ROWS // MICRO, "micro_batch_size": MICRO}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    ref = _reference()  # trained below by a plain loop on the whole batch
    stage = PipelineLayer(_descs(), topology=hcg.topology(), loss_fn=_loss)
    ref_params = dict(ref.named_parameters())
    with torch.no_grad():
        for name, p in stage.named_parameters():
            p.copy_(local_slice(ref_params[name], p, hcg))
    assert any(is_split(p) for p in stage.parameters())  # the stage really holds tensor-parallel slices
    model = fleet.distributed_model(stage)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    if clip is not None:
        opt._grad_clip = ClipGradByGlobalNorm(clip)  # Paddle's grad_clip= on a plain optimizer
    d_loss = []
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        x, y = torch.randint(0, VOCAB, (ROWS, 5), generator=g), torch.randint(0, VOCAB, (ROWS, 5), generator=g)
        loss = model.train_batch([x, y], opt)
        ref_opt.zero_grad()
        ref_loss = _loss(ref(x), y)
        ref_loss.backward()
        if clip is not None:
            assert torch.nn.utils.clip_grad_norm_(ref.parameters(), clip) > 2 * clip  # the clip does act
        ref_opt.step()
        d_loss.append(abs(loss.item() - ref_loss.item()))
    d_param = worst(max_abs_diff(p, local_slice(ref_params[n], p, hcg)) for n, p in stage.named_parameters())
    return worst(d_loss), d_param


@pytest.mark.parametrize("clip", [None, 0.05])
def test_mp2_pp2_equals_single_process(clip):
    """With ``clip``: the global norm counts each slice once across mp and each stage's parameters once."""
    for d_loss, d_param in run_ranks(_mp_pp, world_size=4, kwargs={"clip": clip}, timeout=240):
        assert d_loss < 1e-5 and d_param < 1e-5
