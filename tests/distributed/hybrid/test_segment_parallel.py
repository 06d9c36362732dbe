"""Segment parallelism (``sep_degree`` > 1, Paddle's ``SegmentParallel``): a small causal transformer with the
Ulysses all-to-all around its attention trains, on sep2 (2 ranks) and dp2 x sep2 (4 ranks), equal to the same
model on one process with the full sequence and the whole batch (losses and weights, every rank); the
all-to-all's forward and backward against slices of a global tensor; the clear errors. Paddle's
``optimizer._grad_clip`` clips by the whole model's norm under sep too."""

import pytest
import torch
import torch.distributed as tdist
import torch.nn as nn
import torch.nn.functional as F
from hybrid_models import init_fleet

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import DistributedStrategy
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import SegmentParallel, split_inputs_sequence_dim
from fleetlite.distributed.fleet.meta_parallel.segment_parallel import (
    ReshardLayer,
    heads_to_sequence,
    segment_attention,
    sequence_offset,
    sequence_to_heads,
)
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

VOCAB, DIM, HEADS, SEQ, BATCH, STEPS, LR, CLIP = 32, 16, 4, 8, 4, 4, 0.5, 0.5


class Attention(nn.Module):
    """Causal self-attention; with ``segment`` the Ulysses all-to-all around the attention proper, written out
    (``helper=False``) or through ``segment_attention``."""

    def __init__(self, segment: bool, helper: bool) -> None:
        super().__init__()
        self.qkv, self.proj, self.segment = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM), segment
        self.helper = helper

    def forward(self, x):
        b, s, _ = x.shape  # s: this rank's part of the sequence under sep
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, DIM // HEADS).unbind(2)  # [b, s, h, d] each
        if self.segment and self.helper:
            return self.proj(segment_attention(q, k, v, is_causal=True).reshape(b, s, DIM))
        if self.segment:  # [b, s/sep, h, d] -> [b, s, h/sep, d]
            q, k, v = (sequence_to_heads(t) for t in (q, k, v))
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
        if self.segment:  # [b, s, h/sep, d] -> [b, s/sep, h, d]
            out = heads_to_sequence(out)
        return self.proj(out.reshape(b, s, DIM))


class Block(nn.Module):
    def __init__(self, segment: bool, helper: bool = False) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(DIM), Attention(segment, helper), nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, segment: bool = False) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.blocks = nn.Sequential(Block(segment), Block(segment, helper=True))
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)
        self.segment = segment

    def forward(self, ids):
        offset = sequence_offset(ids.shape[1]) if self.segment else 0  # global positions of this part
        pos = torch.arange(offset, offset + ids.shape[1])
        return self.head(self.ln(self.blocks(self.tok(ids) + self.pos(pos))))


def _loss(model, ids, labels):
    return F.cross_entropy(model(ids).reshape(-1, VOCAB), labels.reshape(-1))  # mean over this rank's tokens


def _batch(step):
    tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(100 + step))
    return tokens[:, :-1], tokens[:, 1:]


def _train(rank, world, hybrid):
    hcg = init_fleet(hybrid)
    torch.manual_seed(0)
    ref = TinyGPT()
    torch.manual_seed(1 + rank)  # different weights on every rank: the wrapper's broadcast must agree them
    net = TinyGPT(segment=True)
    if rank == 0:  # the dp x sep group's first rank holds the reference's weights
        net.load_state_dict(ref.state_dict())
    model = fleet.distributed_model(net)
    opt = torch.optim.SGD(model.parameters(), lr=LR)  # SGD: a gradient's scale shows in the weights
    opt._grad_clip = ClipGradByGlobalNorm(CLIP)  # Paddle's grad_clip, read from the optimizer
    opt = fleet.distributed_optimizer(opt)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    dp, dp_rank = hcg.get_data_parallel_world_size(), hcg.get_data_parallel_rank()
    dp_sep = hcg.get_dp_sep_parallel_group()
    losses, ref_losses, norms, ref_norms = [], [], [], []
    for step in range(STEPS):
        ids, labels = _batch(step)
        ref_loss = _loss(ref, ids, labels)  # one process: the whole batch, the full sequence
        ref_loss.backward()
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP))
        ref_opt.step()
        ref_opt.zero_grad()
        rows = slice(dp_rank * BATCH // dp, (dp_rank + 1) * BATCH // dp)
        local_ids, local_labels = split_inputs_sequence_dim([ids[rows], labels[rows]])
        loss = _loss(model, local_ids, local_labels)
        loss.backward()
        opt.step()
        norms.append(opt.hybrid_clip.last_norm.detach().clone())
        opt.clear_grad()
        mean = loss.detach().clone()  # the full batch's loss: the mean over dp x sep
        tdist.all_reduce(mean, group=dp_sep)
        losses.append(mean / tdist.get_world_size(dp_sep))
        ref_losses.append(ref_loss.detach())
    return dict(losses=torch.stack(losses), ref_losses=torch.stack(ref_losses), norms=torch.stack(norms),
                ref_norms=torch.stack(ref_norms), weights=net.state_dict(),
                ref_weights=ref.state_dict(), kind=type(model).__name__, local_seq=local_ids.shape[1],
                groups={name: tdist.get_process_group_ranks(g) for name, g in (
                    ("sep", hcg.get_sep_parallel_group()), ("dp_sep", dp_sep),
                    ("pp_mp", hcg.get_pp_mp_parallel_group()))})


def _check_training(out, sep):
    for rank, r in enumerate(out):
        assert r["kind"] == "SegmentParallel" and r["local_seq"] == SEQ // sep
        torch.testing.assert_close(r["losses"], r["ref_losses"], rtol=0, atol=1e-5)
        torch.testing.assert_close(r["norms"], r["ref_norms"], rtol=0, atol=1e-5)
        assert (r["ref_norms"] > CLIP).all()  # clipping really happened
        for key, ref in r["ref_weights"].items():
            torch.testing.assert_close(r["weights"][key], ref, rtol=0, atol=1e-5, msg=f"rank {rank} {key}")


@pytest.mark.timeout(200)
def test_sep2_trains_like_one_process_on_the_full_sequence():
    out = run_ranks(_train, world_size=2, args=({"dp_degree": 1, "sep_degree": 2},), timeout=190)
    _check_training(out, 2)
    for rank, r in enumerate(out):
        assert r["groups"] == {"sep": [0, 1], "dp_sep": [0, 1], "pp_mp": [rank]}


@pytest.mark.timeout(300)
def test_dp2_sep2_trains_like_one_process_on_four_ranks():
    out = run_ranks(_train, world_size=4, args=({"dp_degree": 2, "sep_degree": 2},), timeout=290)
    _check_training(out, 2)
    for rank, r in enumerate(out):  # order dp, pp, sharding, sep, mp: rank = 2 * dp_rank + sep_rank
        assert r["groups"] == {"sep": [rank // 2 * 2, rank // 2 * 2 + 1], "dp_sep": [0, 1, 2, 3], "pp_mp": [rank]}


def _all_to_all(rank, world):
    init_fleet({"dp_degree": 1, "sep_degree": 2})
    b, s, h, d = 2, 4, 4, 3
    full = torch.arange(b * s * h * d, dtype=torch.float64).reshape(b, s, h, d)  # [b, s, h, d] of one process
    grad_full = torch.randn(b, s, h, d, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    seq, heads = slice(rank * s // 2, (rank + 1) * s // 2), slice(rank * h // 2, (rank + 1) * h // 2)
    x = full[:, seq].clone().requires_grad_()  # this rank's positions, every head
    y = sequence_to_heads(x)
    y.backward(grad_full[:, :, heads])
    w = full[:, :, heads].clone().requires_grad_()  # every position, this rank's heads
    z = heads_to_sequence(w)
    z.backward(grad_full[:, seq])
    layer = ReshardLayer()(x.detach(), split_axis=2, concat_axis=1)
    errors = []
    for call in (lambda: sequence_to_heads(torch.zeros(1, 2, 3, 2)),  # 3 heads over sep 2
                 lambda: heads_to_sequence(torch.zeros(1, 3, 2, 2))):  # a sequence of 3 over sep 2
        try:
            call()
        except ValueError as e:
            errors.append(str(e))
    return dict(y=y.detach(), x_grad=x.grad, z=z.detach(), w_grad=w.grad, layer=layer, errors=errors,
                expected=dict(y=full[:, :, heads], x_grad=grad_full[:, seq], z=full[:, seq],
                              w_grad=grad_full[:, :, heads], layer=full[:, :, heads]))


@pytest.mark.timeout(120)
def test_all_to_all_forward_and_backward_against_slices_of_the_global_tensor():
    for r in run_ranks(_all_to_all, world_size=2, timeout=110):
        for key, expected in r["expected"].items():  # exact: the all-to-all only moves values
            torch.testing.assert_close(r[key], expected, rtol=0, atol=0, msg=key)
        assert len(r["errors"]) == 2
        assert "heads axis 2 of a (1, 2, 3, 2) tensor over sep_degree 2" in r["errors"][0]
        assert "sequence axis 1 of a (1, 3, 2, 2) tensor" in r["errors"][1]
        assert all(len(e.splitlines()) == 1 and "multiple of sep_degree" in e for e in r["errors"])


def test_split_inputs_sequence_dim_as_paddle():
    ids = torch.arange(12).reshape(2, 6)
    parts = [split_inputs_sequence_dim({"ids": ids, "mask": None}, sep_rank=r, sep_degree=3) for r in range(3)]
    assert [p["ids"].tolist() for p in parts] == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10, 11]]]
    assert parts[0]["mask"] is None
    a, b = split_inputs_sequence_dim([ids, ids + 1], sep_rank=1, sep_degree=2)
    assert a.tolist() == [[3, 4, 5], [9, 10, 11]] and b.tolist() == [[4, 5, 6], [10, 11, 12]]
    assert split_inputs_sequence_dim(ids, sep_rank=0, sep_degree=1) is ids
    with pytest.raises(ValueError, match="sequence length 6 does not divide into sep_degree 4 equal parts"):
        split_inputs_sequence_dim(ids, sep_rank=0, sep_degree=4)
    with pytest.raises(ValueError, match="splits \\[batch, seq\\] tensors"):
        split_inputs_sequence_dim(ids.view(2, 3, 2), sep_rank=0, sep_degree=2)


@pytest.mark.parametrize("hybrid, beside", [
    ({"sep_degree": 2, "pp_degree": 2}, "pp_degree=2"),
    ({"sep_degree": 2, "sharding_degree": 2}, "sharding_degree=2"),
])
def test_sep_beside_pp_or_sharding_is_refused_in_one_line(hybrid, beside):
    DistributedStrategy.from_dict({"hybrid_configs": {"sep_degree": 2}}).check_supported(2)  # sep alone runs
    DistributedStrategy.from_dict({"hybrid_configs": {"sep_degree": 2, "mp_degree": 2}}).check_supported(4)  # with mp
    s = DistributedStrategy.from_dict({"hybrid_configs": hybrid})
    with pytest.raises(NotImplementedError, match=f"sep_degree'\\] = 2 beside {beside}") as info:
        s.check_supported(4)
    assert len(str(info.value).splitlines()) == 1


def test_without_a_sep_axis_the_helpers_change_nothing():
    fleet_impl._reset()  # no fleet.init: a sep degree of 1
    q, k, v = torch.randn(3, 2, 6, 4, 5).unbind(0)  # [b, s, h, d]
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(segment_attention(q, k, v, is_causal=True), expected.transpose(1, 2))
    ids = torch.arange(6).view(1, 6)
    assert split_inputs_sequence_dim(ids) is ids and sequence_offset(6) == 0 and sequence_to_heads(q) is q


def test_segment_parallel_is_paddles_export():
    assert fleet.meta_parallel.SegmentParallel is SegmentParallel
    assert fleet.meta_parallel.split_inputs_sequence_dim is split_inputs_sequence_dim


# fleetlite's GPT (the gpt recipe's model) calls segment_attention and sequence_offset: under sep2 it trains
# like one process on the full sequence
def _gpt_steps(model, opt, sep_group=None):
    from fleetlite.distributed.fleet import meta_parallel as mpu

    losses = []
    for step in range(STEPS):
        tokens = torch.randint(64, (4, 17), generator=torch.Generator().manual_seed(200 + step))
        ids, targets = mpu.split_inputs_sequence_dim([tokens[:, :-1], tokens[:, 1:]])  # unchanged with no sep
        loss = model(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss = loss.detach().clone()
        if sep_group is not None:  # the full sequence's loss: the mean over dp x sep
            tdist.all_reduce(loss, group=sep_group)
            loss /= tdist.get_world_size(sep_group)
        losses.append(loss)
    return torch.stack(losses)


def _gpt_config():
    from fleetlite.text.gpt import GPTConfig

    return GPTConfig(vocab_size=64, width=32, layers=2, heads=4, seq_len=16)


def _gpt_sep2(rank, world):
    from fleetlite.text.gpt import GPT

    init_fleet({"sep_degree": 2})
    net = GPT(_gpt_config())
    model = fleet.distributed_model(net)
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=LR))
    losses = _gpt_steps(model, opt, fleet.get_hybrid_communicate_group().get_dp_sep_parallel_group())
    return dict(losses=losses, weights=net.state_dict(), kind=type(model).__name__)


@pytest.mark.timeout(200)
def test_fleetlite_gpt_on_sep2_trains_like_one_process():
    from fleetlite.text.gpt import GPT

    fleet_impl._reset()  # the reference: one process, no fleet
    ref = GPT(_gpt_config())
    ref_losses = _gpt_steps(ref, torch.optim.SGD(ref.parameters(), lr=LR))
    for rank, r in enumerate(run_ranks(_gpt_sep2, world_size=2, timeout=190)):
        assert r["kind"] == "SegmentParallel"
        torch.testing.assert_close(r["losses"], ref_losses, rtol=0, atol=1e-5)
        for key, value in ref.state_dict().items():
            torch.testing.assert_close(r["weights"][key], value, rtol=0, atol=1e-5, msg=f"rank {rank} {key}")
