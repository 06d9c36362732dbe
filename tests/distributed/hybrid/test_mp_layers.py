"""Tensor-parallel layers against single-process torch layers from the same full weights
(Paddle's hybrid_parallel_mp_layers.py checks), the rng tracker, and the one-line errors."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hybrid_models import copy_from, init_fleet, local_slice, run_cases
from parity import max_abs_diff, worst

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet import meta_parallel as mpu
from fleetlite.testing import run_ranks

_diff = max_abs_diff


class _LastDim:
    split_axis = -1


def _last(t, hcg):
    """This mp rank's slice of the last dimension."""
    return local_slice(t, _LastDim, hcg)


def _linear_case(layer, ref, hcg, x, parallel_in=False):
    copy_from(layer, ref, hcg)
    ref_params = dict(ref.named_parameters())
    xin = x.clone().requires_grad_(True)
    xr = x.clone().requires_grad_(True)
    out, out_ref = layer(_last(xin, hcg) if parallel_in else xin), ref(xr)
    w = torch.randn_like(out_ref)
    sliced_out = out.shape != out_ref.shape  # a column layer without gather_output
    (out * (_last(w, hcg) if sliced_out else w)).sum().backward()
    (out_ref * w).sum().backward()
    diffs = [_diff(out, _last(out_ref, hcg) if sliced_out else out_ref),
             _diff(_last(xin.grad, hcg), _last(xr.grad, hcg)) if parallel_in else _diff(xin.grad, xr.grad)]
    for name, p in layer.named_parameters():
        diffs.append(_diff(p.grad, local_slice(ref_params[name].grad, p, hcg)))
    return worst(diffs)


def _layers(rank, world):
    hcg = init_fleet({"mp_degree": world})
    torch.manual_seed(0)
    x = torch.randn(3, 4, 8)
    out = {}
    out["column_gather"] = _linear_case(mpu.ColumnParallelLinear(8, 6, has_bias=True, gather_output=True),
                                        nn.Linear(8, 6), hcg, x)
    out["column_split"] = _linear_case(mpu.ColumnParallelLinear(8, 6, has_bias=True, gather_output=False),
                                       nn.Linear(8, 6), hcg, x)
    out["row"] = _linear_case(mpu.RowParallelLinear(8, 5), nn.Linear(8, 5), hcg, x)
    out["row_parallel_in"] = _linear_case(mpu.RowParallelLinear(8, 5, input_is_parallel=True), nn.Linear(8, 5),
                                          hcg, x, parallel_in=True)
    # embedding
    emb, ref = mpu.VocabParallelEmbedding(10, 4), nn.Embedding(10, 4)
    with torch.no_grad():
        emb.weight.copy_(local_slice(ref.weight, emb.weight, hcg))
    ids = torch.randint(0, 10, (3, 7))
    w = torch.randn(3, 7, 4)
    e, er = emb(ids), ref(ids)
    (e * w).sum().backward()
    (er * w).sum().backward()
    out["embedding"] = worst([_diff(e, er), _diff(emb.weight.grad, local_slice(ref.weight.grad, emb.weight, hcg))])
    out["embedding_grad_is_a_slice"] = tuple(emb.weight.grad.shape)
    # parallel cross entropy, with ignore_index and Paddle's [N, 1] labels
    logits = torch.randn(6, 10)
    label = torch.tensor([0, 9, 4, 5, -100, 3])
    lp = _last(logits, hcg).clone().requires_grad_(True)
    lr = logits.clone().requires_grad_(True)
    loss = mpu.ParallelCrossEntropy()(lp, label.unsqueeze(-1))
    ref_loss = F.cross_entropy(lr, label, reduction="none", ignore_index=-100)
    weights = torch.rand(6)
    (loss.squeeze(-1) * weights).sum().backward()
    (ref_loss * weights).sum().backward()
    out["cross_entropy"] = worst([_diff(loss.squeeze(-1), ref_loss), _diff(lp.grad, _last(lr.grad, hcg))])
    out["ce_shape"] = tuple(loss.shape)
    # the rng tracker: dropout differs across mp ranks inside rng_state(), agrees outside
    mpu.model_parallel_random_seed(1234)
    ones = torch.ones(64)
    with mpu.get_rng_state_tracker().rng_state():
        inside = F.dropout(ones, 0.5)
    outside = F.dropout(ones, 0.5)
    out["masks"] = (inside, outside)
    # errors, one line each
    try:
        mpu.ColumnParallelLinear(8, 5)
    except ValueError as e:
        out["not_divisible"] = str(e)
    try:
        mpu.VocabParallelEmbedding(11, 4)
    except ValueError as e:
        out["vocab_not_divisible"] = str(e)
    return out


@pytest.fixture(scope="module")
def mp2():
    """Every rank's results of the mp2 runs of this file, by name: one 2-rank launch for the module."""
    cases = {"layers": (_layers, (), {}), "tied": (_tied, (), {}), "storage": (_storage, (), {})}
    return run_ranks(run_cases, world_size=2, args=(cases,), timeout=400)


@pytest.mark.timeout(500)
def test_mp_layers_equal_single_process_layers_on_two_ranks(mp2):
    res = [r["layers"] for r in mp2]
    for r in res:
        for key in ("column_gather", "column_split", "row", "row_parallel_in", "embedding", "cross_entropy"):
            assert r[key] <= 1e-5, (key, r[key])
        assert r["embedding_grad_is_a_slice"] == (5, 4) and r["ce_shape"] == (6, 1)
        assert "out_features = 5 is not divisible by mp_degree 2" in r["not_divisible"]
        assert "\n" not in r["not_divisible"] and "num_embeddings" in r["vocab_not_divisible"]
    assert not torch.equal(res[0]["masks"][0], res[1]["masks"][0])  # inside rng_state: per mp rank
    assert torch.equal(res[0]["masks"][1], res[1]["masks"][1])  # outside: the global seed, equal


def test_layer_before_fleet_init_fails_with_one_line(clean_dist_env):
    fleet_impl._reset()
    with pytest.raises(RuntimeError, match=r"^ColumnParallelLinear was built before fleet.init\(\)") as info:
        mpu.ColumnParallelLinear(4, 4)
    assert "\n" not in str(info.value)


def test_single_process_layers_are_plain_layers(clean_dist_env):
    fleet_impl._reset()
    try:
        fleet.init(is_collective=True)
        torch.manual_seed(0)
        layer = mpu.ColumnParallelLinear(4, 6, has_bias=True)
        torch.manual_seed(0)
        ref = nn.Linear(4, 6)
        assert torch.equal(layer.weight, ref.weight)  # the full init, as a single process draws it
        assert not mpu.is_split(layer.weight) and layer.bias.abs().sum() == 0  # Paddle: bias starts at zero
        x = torch.randn(2, 4)
        assert torch.allclose(layer(x), F.linear(x, ref.weight))
        with pytest.raises(ValueError, match="model_parallel_random_seed"):
            with mpu.RNGStatesTracker().rng_state():
                pass
    finally:
        fleet_impl._reset()


def test_paddles_mpu_import_path_names_the_same_objects():
    from fleetlite.distributed.fleet.layers import mpu

    assert mpu.ColumnParallelLinear is fleet.meta_parallel.ColumnParallelLinear
    assert mpu.get_rng_state_tracker() is fleet.meta_parallel.get_rng_state_tracker()
    assert mpu.mp_ops._c_identity is fleet.meta_parallel.mp_ops._c_identity


def _tied(rank, world):
    hcg = init_fleet({"mp_degree": 2})
    torch.manual_seed(0)
    ref = nn.Embedding(10, 4)
    emb = mpu.VocabParallelEmbedding(10, 4)
    head = mpu.ColumnParallelLinear(4, 10, gather_output=False)
    head.weight = emb.weight  # tied: both hold this rank's rows of the vocabulary, [10 / mp, 4]
    with torch.no_grad():
        emb.weight.copy_(local_slice(ref.weight, emb.weight, hcg))
    ids = torch.randint(0, 10, (3, 5))
    loss = mpu.ParallelCrossEntropy()(head(emb(ids)), ids).mean()
    loss.backward()
    ref_loss = F.cross_entropy(F.linear(ref(ids), ref.weight).flatten(0, 1), ids.flatten())
    ref_loss.backward()
    return worst([_diff(loss, ref_loss), _diff(emb.weight.grad, local_slice(ref.weight.grad, emb.weight, hcg))])


@pytest.mark.timeout(500)
def test_tied_embedding_and_head_share_one_slice_and_its_gradient(mp2):
    for diff in (r["tied"] for r in mp2):
        assert diff <= 1e-5, diff


def _storage(rank, world):
    init_fleet({"mp_degree": 2})
    layers = (mpu.ColumnParallelLinear(8, 6, has_bias=True, gather_output=False),
              mpu.RowParallelLinear(6, 8, has_bias=True, input_is_parallel=True), mpu.VocabParallelEmbedding(10, 4))
    return [(p.numel() * p.element_size(), p.untyped_storage().nbytes()) for m in layers for p in m.parameters()]


@pytest.mark.timeout(500)
def test_a_slice_holds_only_its_own_storage(mp2):
    """Each rank keeps its slice, not a view into the full weight it was cut from (that would keep the whole
    weight in memory: tensor parallelism would save nothing)."""
    for sizes in (r["storage"] for r in mp2):
        assert all(own == storage for own, storage in sizes), sizes
