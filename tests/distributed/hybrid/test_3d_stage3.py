"""Sharding stage 3 (FSDP2) beside pipelines AND tensor parallelism (Note [stage 3 beside pp and mp]): pp2 × mp2 ×
sharding2 on 8 ranks, each stage's tensor-parallel slices ``fully_shard``-ed over the two ranks that hold the same
stage and slices, trains like a hand-written single-process model from the same full weights on the global batch
(AdamW, the whole model's global-norm clip through ``fleet.distributed_optimizer``), evaluates like it, every rank's
shards checked against the reference's; the full state gathers to the single-process model's state, which loads into
one process and evaluates alike; a DCP checkpoint of the model and AdamW loads into one process as the reference's
weights and AdamW state; and a single-process state loads back into the shards.

One launch covers training, evaluation and the checkpoint: 8 processes on a small machine are slow."""

import pytest
import torch
import torch.distributed as tdist
import torch.nn.functional as F
from parity import max_abs_diff, worst
from torch import nn

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import (
    ColumnParallelLinear,
    LayerDesc,
    PipelineLayer,
    PipelineParallel,
    RowParallelLinear,
    VocabParallelEmbedding,
    is_split,
)
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

# the single-process side of the DCP check
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")

VOCAB, WIDTH, HIDDEN, SEQ = 16, 8, 12, 3
STEPS, ROWS, MICRO, CLIP, TOL = 3, 4, 2, 0.05, 1e-5


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
    """Stage 0: the vocabulary-parallel embedding and a column/row block; stage 1: a norm and a column head."""
    return [LayerDesc(VocabParallelEmbedding, VOCAB, WIDTH), LayerDesc(TPBlock), LayerDesc(nn.LayerNorm, WIDTH),
            LayerDesc(ColumnParallelLinear, WIDTH, VOCAB, has_bias=False, gather_output=True)]


def _reference(seed):
    """The same layers as a plain torch model (its parameter names are the stages' global layer indices)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), RefBlock(), nn.LayerNorm(WIDTH),
                         nn.Linear(WIDTH, VOCAB, bias=False))


def _batch(step, part):
    g = torch.Generator().manual_seed(100 * step + part)
    return torch.randint(0, VOCAB, (ROWS, SEQ), generator=g), torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)


def _slice(full, param, hcg):
    """The reference's mp slice of ``full`` for ``param`` (as the layers slice at construction)."""
    if not is_split(param):
        return full
    return full.chunk(hcg.get_model_parallel_world_size(), dim=param.split_axis)[hcg.get_model_parallel_rank()]


def _shard_of(full, param, hcg):
    """The mp slice, then FSDP2's dim-0 chunk for this data × sharding rank (torch.chunk's sizes)."""
    part = _slice(full, param, hcg)
    n, r = hcg.get_data_sharding_parallel_world_size(), hcg.get_data_sharding_parallel_rank()
    return (list(part.chunk(n, dim=0)) + [part[:0]] * n)[r]


def _shard_diff(stage, ref, hcg):
    """How far this rank's shards are from the reference's (every parameter must be a sharded DTensor)."""
    ref_params = dict(ref.named_parameters())
    out = []
    for name, p in stage.named_parameters():
        assert hasattr(p, "to_local") and p.to_local().numel() < p.numel(), (name, type(p))
        out.append(max_abs_diff(p.to_local(), _shard_of(ref_params[name].detach(), p, hcg)))
    return worst(out)


def _pp2_mp2_stage3(rank, world, save_dir):
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy(sharding=True, sharding_configs={"stage": 3})
    strategy.hybrid_configs = {"dp_degree": 1, "pp_degree": 2, "mp_degree": 2, "sharding_degree": 2}
    strategy.pipeline_configs = {"accumulate_steps": ROWS // MICRO, "micro_batch_size": MICRO}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    ref = _reference(0)
    torch.manual_seed(1 + rank)  # every rank builds other weights: the copy below must set each of them
    stage = PipelineLayer(_descs(), topology=hcg.topology(), loss_fn=_loss)
    ref_params = dict(ref.named_parameters())
    with torch.no_grad():
        for name, p in stage.named_parameters():
            p.copy_(_slice(ref_params[name], p, hcg))
    split = any(is_split(p) for p in stage.parameters())  # the stage really holds tensor-parallel slices
    model = fleet.distributed_model(stage)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inner._grad_clip = ClipGradByGlobalNorm(CLIP)
    opt = fleet.distributed_optimizer(inner)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    part, parts = hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()
    d_loss, clipped = [], True
    for step in range(STEPS):
        shards = [_batch(step, d) for d in range(parts)]
        loss = model.train_batch(list(shards[part]), opt)
        losses = [_loss(ref(x), y) for x, y in shards]
        ref_opt.zero_grad()
        torch.stack(losses).mean().backward()
        clipped &= bool(torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP) > 2 * CLIP)  # the clip acts
        ref_opt.step()
        d_loss.append(max_abs_diff(loss, losses[part]))
    x, y = _batch(STEPS, part)
    with torch.no_grad():
        ref_eval = _loss(ref(x), y)
    d_eval = max_abs_diff(model.eval_batch([x, y], compute_loss=True), ref_eval)
    d_shard = _shard_diff(stage, ref, hcg)  # (after an evaluation too: the stage is sharded again)
    full = model.full_state_dict()  # collective: over data × sharding, mp and the pipe
    d_full = max_abs_diff(full, ref.state_dict())
    keys = sorted(full) == sorted(ref.state_dict())
    one = _reference(5)  # the checkpoint loads into one process and evaluates as the reference
    one.load_state_dict(full)
    with torch.no_grad():
        d_one = max_abs_diff(_loss(one(x), y), ref_eval)
    import torch.distributed.checkpoint as dcp

    from fleetlite.distributed.fleet.meta_parallel import hybrid_state

    dcp.save(hybrid_state.dcp_state(stage, opt, writing=True), checkpoint_id=save_dir)  # read by one process below
    other = _reference(7)  # another single-process model: its state loads into the shards
    model.load_full_state_dict(other.state_dict())
    d_load = _shard_diff(stage, other, hcg)
    return dict(loss=worst(d_loss), eval=d_eval, shard=d_shard, full=d_full, keys=keys, one=d_one, load=d_load,
                clipped=clipped, split=split, is_pp=isinstance(model, PipelineParallel), stage3=model.stage3,
                data=tdist.get_process_group_ranks(hcg.get_data_sharding_parallel_group()),
                ref={k: v.clone() for k, v in ref.state_dict().items()},
                ref_optim={f"state.{n}.{k}": v.clone() for n, p in ref.named_parameters()
                           for k, v in ref_opt.state[p].items() if k != "step"})


def _one_process_from(save_dir):
    """A single-process model and AdamW (other values, one step taken so the state exists) loaded from the ranks'
    DCP checkpoint: (model state, flattened optimizer state)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    one = _reference(9)
    opt = torch.optim.AdamW(one.parameters(), lr=1e-2)
    x, y = _batch(0, 0)
    _loss(one(x), y).backward()
    opt.step()
    state = {"model": one.state_dict(),
             "optim": get_optimizer_state_dict(one, opt, options=StateDictOptions(flatten_optimizer_state_dict=True))}
    dcp.load(state, checkpoint_id=save_dir, no_dist=True)
    return state["model"], state["optim"]


@pytest.mark.timeout(600)
def test_pp2_mp2_sharding2_stage3_trains_evaluates_and_checkpoints_like_a_single_process_on_eight_ranks(tmp_path):
    out = run_ranks(_pp2_mp2_stage3, world_size=8, args=(str(tmp_path / "dcp"),), timeout=590)
    model, optim = _one_process_from(str(tmp_path / "dcp"))
    for rank, r in enumerate(out):
        assert r["loss"] <= TOL and r["eval"] <= TOL and r["shard"] <= TOL, (rank, r)
        assert r["clipped"] and r["split"] and r["is_pp"] and r["stage3"], (rank, r)
        assert r["full"] <= TOL and r["keys"] and r["one"] <= TOL and r["load"] == 0.0, (rank, r)
        # the order is dp, pp, sharding, mp: the data × sharding pair of a rank is two apart
        assert r["data"] == sorted({rank, rank ^ 2}), (rank, r)
        assert max_abs_diff(r["ref"], model) <= TOL and sorted(model) == sorted(r["ref"]), rank
        assert max_abs_diff(r["ref_optim"], optim) <= TOL, rank


def test_stage3_beside_pp_and_mp_together_is_accepted():
    strategy = fleet.DistributedStrategy(sharding=True, sharding_configs={"stage": 3})
    strategy.hybrid_configs = {"pp_degree": 2, "mp_degree": 2, "sharding_degree": 2}
    strategy.check_supported(8)
