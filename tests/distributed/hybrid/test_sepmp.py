"""Segment parallelism beside tensor parallelism (``mp_degree=2, sep_degree=2`` on 4 ranks, Paddle's order
``[dp, pp, sharding, sep, mp]``): a tiny attention block whose heads are split over mp first (a
``ColumnParallelLinear`` qkv without gather), then this rank's heads moved between the sequence split and the
heads split by the all-to-all over sep, trains 3 SGD steps equal to one torch process on the full sequence with
every head (losses and weights, every rank, within 1e-5).

SGD makes a wrong gradient scale show: with the engine over dp only instead of dp x sep (measured by passing
``hcg.get_data_sharding_parallel_group()`` to the engine on purpose; dp is 1 here, so no averaging at all) the
weights leave the reference by 5.4e-2 and the loss by 4.8e-3 after 3 steps (each sep rank keeps the gradient of
its own sequence part).
"""

import pytest
import torch
import torch.distributed as tdist
import torch.nn as nn
import torch.nn.functional as F
from hybrid_models import copy_from, init_fleet, local_slice

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet.meta_parallel import ColumnParallelLinear, RowParallelLinear
from fleetlite.distributed.fleet.meta_parallel.segment_parallel import (
    heads_to_sequence,
    segment_attention,
    sequence_to_heads,
)
from fleetlite.testing import run_ranks

DIM, HEADS, SEQ, BATCH, STEPS, LR = 16, 4, 8, 2, 3, 0.5
HD = DIM // HEADS


class SepMPBlock(nn.Module):
    """qkv column-parallel (heads over mp; the qkv features laid out per head, ``[heads, 3, head_dim]``, so an mp
    slice holds whole heads) -> all-to-all over sep around attention -> row-parallel output projection."""

    def __init__(self, heads: int = HEADS, helper: bool = True) -> None:
        super().__init__()
        self.qkv = ColumnParallelLinear(DIM, 3 * DIM, has_bias=True, gather_output=False)
        self.out = RowParallelLinear(DIM, DIM, input_is_parallel=True)
        self.heads, self.helper = heads, helper

    def forward(self, x):
        b, s, _ = x.shape  # s: this rank's part of the sequence
        local = self.qkv.output_size_per_partition // (3 * (DIM // self.heads))  # heads / mp
        q, k, v = self.qkv(x).view(b, s, local, 3, DIM // self.heads).unbind(3)  # [b, s/sep, h/mp, d]
        if self.helper:
            out = segment_attention(q, k, v, is_causal=True)
        else:  # written out: [b, s/sep, h/mp, d] -> [b, s, h/(mp sep), d] -> attention -> back
            q, k, v = (sequence_to_heads(t).transpose(1, 2) for t in (q, k, v))
            out = heads_to_sequence(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2))
        return self.out(out.reshape(b, s, -1))


class Reference(nn.Module):
    """The same block on one process: the full sequence, every head (plain torch)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self.qkv(x).view(b, s, HEADS, 3, HD).unbind(3))
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, DIM))


def _batch(step):
    g = torch.Generator().manual_seed(300 + step)
    return torch.randn(BATCH, SEQ, DIM, generator=g), torch.randn(BATCH, SEQ, DIM, generator=g)


def _loss(y, target):
    return F.mse_loss(y, target)  # the mean over this rank's tokens


def _train(rank, world, helper):
    hcg = init_fleet({"dp_degree": 1, "mp_degree": 2, "sep_degree": 2})
    torch.manual_seed(0)
    ref = Reference()
    net = SepMPBlock(helper=helper)
    copy_from(net, ref, hcg)  # this rank's mp slices of the reference's weights
    model = fleet.distributed_model(net)
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=LR))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    dp_sep = hcg.get_dp_sep_parallel_group()
    losses, ref_losses = [], []
    for step in range(STEPS):
        x, target = _batch(step)
        ref_loss = _loss(ref(x), target)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        sep, sep_rank = hcg.get_sep_parallel_world_size(), hcg.get_sep_parallel_rank()
        part = slice(sep_rank * SEQ // sep, (sep_rank + 1) * SEQ // sep)  # this rank's positions
        loss = _loss(model(x[:, part]), target[:, part])
        loss.backward()
        opt.step()
        opt.clear_grad()
        mean = loss.detach().clone()  # the full sequence's loss: the mean over dp x sep
        tdist.all_reduce(mean, group=dp_sep)
        losses.append(mean / tdist.get_world_size(dp_sep))
        ref_losses.append(ref_loss.detach())
    ref_state = ref.state_dict()
    return dict(kind=type(model).__name__, losses=torch.stack(losses), ref_losses=torch.stack(ref_losses),
                weights={k: (v.detach().clone(), local_slice(ref_state[k], v, hcg))
                         for k, v in net.state_dict(keep_vars=True).items()},
                coords=(hcg.get_sep_parallel_rank(), hcg.get_model_parallel_rank()))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("helper", [True, False], ids=["segment_attention", "sequence_to_heads"])
def test_mp2_sep2_trains_like_one_process_on_the_full_sequence_and_heads(helper):
    out = run_ranks(_train, world_size=4, args=(helper,), timeout=290)
    assert sorted(r["coords"] for r in out) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # every (sep, mp) place
    for rank, r in enumerate(out):
        assert r["kind"] == "TensorParallel"
        torch.testing.assert_close(r["losses"], r["ref_losses"], rtol=0, atol=1e-5)
        for key, (got, expected) in r["weights"].items():
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5, msg=f"rank {rank} {key}")


def _two_heads(rank, world):
    init_fleet({"dp_degree": 1, "mp_degree": 2, "sep_degree": 2})
    net = SepMPBlock(heads=2)  # 2 heads over mp 2: one per rank, which sep 2 cannot split
    try:
        net(torch.zeros(1, SEQ // 2, DIM))
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.timeout(200)
def test_local_heads_not_divisible_by_sep_is_refused_in_one_line():
    for r in run_ranks(_two_heads, world_size=4, timeout=190):
        assert r is not None and len(r.splitlines()) == 1
        assert "this rank's 1 attention heads (heads / mp_degree 2) over sep_degree 2 ranks" in r
        assert "multiple of mp_degree x sep_degree = 4" in r
