"""The checkpoint view of tensor parallelism: every tensor's DTensor placements on the mp mesh (``placements_of``),
checked against the full weight drawn by one process and cut by ``torch.chunk``; the view's DCP files against
the single-process model's own DCP checkpoint; and the state layout each wrapper answers for the Trainer."""

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import Replicate, Shard

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    sharded_state_dict,
)
from fleetlite.distributed.fleet.meta_parallel.mp_layers import placements_of
from fleetlite.distributed.fleet.meta_parallel.sharded_state import global_view
from fleetlite.parallel import DataParallel
from fleetlite.testing import run_ranks


def _init(mp):
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"mp_degree": mp}
    fleet.init(is_collective=True, strategy=strategy)
    return fleet.get_hybrid_communicate_group()


class _Net(nn.Module):
    """One of each tensor-parallel layer kind beside replicated parameters and a buffer."""

    def __init__(self):
        super().__init__()
        self.emb = VocabParallelEmbedding(8, 4)
        self.up = ColumnParallelLinear(4, 6, has_bias=True, gather_output=False)
        self.down = RowParallelLinear(6, 4, has_bias=True, input_is_parallel=True)
        self.norm = nn.LayerNorm(4)
        self.register_buffer("count", torch.tensor(3))


def _reference():
    """The single process's draws of the same full weights, in the same order (Note [tensor-parallel parameters])."""
    torch.manual_seed(0)
    emb = torch.empty(8, 4)
    nn.init.normal_(emb)
    up, down = nn.Linear(4, 6, bias=False).weight.detach(), nn.Linear(6, 4, bias=False).weight.detach()
    return {"emb.weight": emb, "up.weight": up, "up.bias": torch.zeros(6), "down.weight": down,
            "down.bias": torch.zeros(4), "norm.weight": torch.ones(4), "norm.bias": torch.zeros(4),
            "count": torch.tensor(3)}


def _placements(rank, world):
    hcg = _init(2)
    torch.manual_seed(0)
    net = _Net()
    full = _reference()
    r = hcg.get_model_parallel_rank()
    out = {}
    for key, t in net.state_dict(keep_vars=True).items():
        (p,) = placements_of(t)
        piece = full[key].chunk(2, dim=p.dim)[r] if p.is_shard() else full[key]
        view = global_view(t)
        out[key] = (p, torch.equal(t.detach(), piece), torch.equal(view.full_tensor(), full[key]),
                    view.to_local().data_ptr() == t.data_ptr())
    return out


@pytest.mark.timeout(200)
def test_placements_of_each_layer_kind_are_torch_chunks_of_the_full_weight():
    expected = {"emb.weight": Shard(0), "up.weight": Shard(0), "up.bias": Shard(0), "down.weight": Shard(1),
                "down.bias": Replicate(), "norm.weight": Replicate(), "norm.bias": Replicate(), "count": Replicate()}
    for rank, out in enumerate(run_ranks(_placements, world_size=2, timeout=190)):
        assert {k: v[0] for k, v in out.items()} == expected, rank
        for key, (_, piece, whole, shared) in out.items():
            assert piece and whole and shared, (rank, key, piece, whole, shared)


def _save(rank, world, path):
    _init(2)
    torch.manual_seed(0)
    dcp.save(sharded_state_dict(_Net()), checkpoint_id=path)


@pytest.mark.timeout(200)
def test_the_view_writes_what_a_single_process_dcp_checkpoint_holds(tmp_path):
    run_ranks(_save, world_size=2, args=(str(tmp_path / "mp2"),), timeout=190)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is ... uninitialized, assuming ... a single process"
        dcp.save(_reference(), checkpoint_id=str(tmp_path / "one"), no_dist=True)
    mp2 = FileSystemReader(str(tmp_path / "mp2")).read_metadata().state_dict_metadata
    one = FileSystemReader(str(tmp_path / "one")).read_metadata().state_dict_metadata
    assert set(mp2) == set(one)
    for key, ref in one.items():
        got = mp2[key]
        assert isinstance(got, TensorStorageMetadata) and got.size == ref.size, key
        assert got.properties.dtype == ref.properties.dtype, key
        chunks = sorted((tuple(c.offsets), tuple(c.sizes)) for c in got.chunks)
        if key in ("emb.weight", "up.weight", "up.bias", "down.weight"):  # two pieces, each written once
            assert len(chunks) == 2 and sum(torch.Size(s).numel() for _, s in chunks) == ref.size.numel(), key
        else:  # a replicated tensor is written once, whole (as one process writes it)
            assert chunks == sorted((tuple(c.offsets), tuple(c.sizes)) for c in ref.chunks), key
    state = {k: torch.zeros_like(v) for k, v in _reference().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(tmp_path / "mp2"), no_dist=True)
    for key, value in _reference().items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0)


def _layouts(rank, world):
    _init(2)
    torch.manual_seed(0)
    tp = fleet.distributed_model(_Net())
    dp = DataParallel(nn.Linear(2, 2))
    return tp.state_layout(), dp.state_layout()


@pytest.mark.timeout(200)
def test_the_wrapped_model_answers_its_state_layout():
    for tp, dp in run_ranks(_layouts, world_size=2, timeout=190):
        assert tp.partial and tp.degrees == {"dp": 1, "mp": 2, "pp": 1}
        assert not dp.partial and dp.degrees == {"dp": 2, "mp": 1, "pp": 1}
