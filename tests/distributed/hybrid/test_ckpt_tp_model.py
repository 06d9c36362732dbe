"""Tensor-parallel parameters checkpoint through DCP as DTensor shards and reshard: saved at mp = 2, loaded back
at mp = 2 and into a plain single-process model (mp = 1)."""

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hybrid_models import RefModel, TPModel, copy_from, data, init_fleet, run_cases
from parity import max_abs_diff
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet.meta_parallel import (
    load_sharded_state_dict,
    sharded_optimizer_state_dict,
    sharded_state_dict,
)
from fleetlite.testing import run_ranks


def _save_and_reload(rank, world, path):
    hcg = init_fleet({"mp_degree": 2})
    torch.manual_seed(3)
    model = TPModel()  # the full init sliced: equal to RefModel's draw for the split weights
    dcp.save(sharded_state_dict(model), checkpoint_id=path)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    state = sharded_state_dict(model)
    dcp.load(state, checkpoint_id=path)
    load_sharded_state_dict(model, state)
    back = max_abs_diff(saved, model.state_dict())
    return back, {k: v for k, v in saved.items()}, hcg.get_model_parallel_rank()


def _single_process_model():
    torch.manual_seed(5)
    return RefModel()


@pytest.fixture(scope="module")
def mp2(tmp_path_factory):
    """(the checkpoints' directory, every rank's results of the mp2 runs of this file, each with a directory of its
    own there): one 2-rank launch for the module; ``full`` holds the single-process checkpoint the ranks load."""
    root = tmp_path_factory.mktemp("tp_ckpt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(_single_process_model().state_dict(), checkpoint_id=str(root / "full"), no_dist=True)
    cases = {"reload": (_save_and_reload, (str(root / "ckpt"),), {}), "full": (_load_full, (str(root / "full"),), {}),
             "resume": (_resume_source, (str(root / "resume"),), {})}
    return root, run_ranks(run_cases, world_size=2, args=(cases,), timeout=500)


@pytest.mark.timeout(600)
def test_mp2_checkpoint_reloads_and_reshards_to_one_process(mp2):
    root, runs = mp2
    path = str(root / "ckpt")
    out = [r["reload"] for r in runs]
    for back, _saved, _rank in out:
        assert back == 0.0
    plain = RefModel()
    state = plain.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is ... uninitialized, assuming ... a single process"
        dcp.load(state, checkpoint_id=path, no_dist=True)  # mp = 1: the full tensors, assembled from the shards
    plain.load_state_dict(state)
    full = {0: out[0][1], 1: out[1][1]}
    emb = torch.cat([full[0]["emb.weight"], full[1]["emb.weight"]], dim=0)
    down = torch.cat([full[0]["down.weight"], full[1]["down.weight"]], dim=1)
    assert torch.equal(plain.emb.weight, emb) and torch.equal(plain.down.weight, down)
    assert torch.equal(plain.down.bias, full[0]["down.bias"]) and torch.equal(plain.norm.weight, full[1]["norm.weight"])



def _load_full(rank, world, path):
    hcg = init_fleet({"mp_degree": 2})
    model = TPModel()
    state = sharded_state_dict(model)
    dcp.load(state, checkpoint_id=path)  # mp = 1 -> 2: each rank reads its slice of the full tensors
    load_sharded_state_dict(model, state)
    return {k: v.clone() for k, v in model.state_dict().items()}, hcg.get_model_parallel_rank()


@pytest.mark.timeout(600)
def test_single_process_checkpoint_loads_into_mp2(mp2):
    plain = _single_process_model()  # the model the fixture saved for the ranks
    for state, rank in (r["full"] for r in mp2[1]):
        assert torch.equal(state["up.weight"], plain.up.weight.chunk(2, dim=0)[rank])
        assert torch.equal(state["up.bias"], plain.up.bias.chunk(2)[rank])
        assert torch.equal(state["down.weight"], plain.down.weight.chunk(2, dim=1)[rank])
        assert torch.equal(state["emb.weight"], plain.emb.weight.chunk(2, dim=0)[rank])
        assert torch.equal(state["down.bias"], plain.down.bias) and torch.equal(state["norm.weight"], plain.norm.weight)


def _resume_source(rank, world, path):
    hcg = init_fleet({"mp_degree": 2})
    torch.manual_seed(0)
    ref = RefModel()
    model = TPModel()
    copy_from(model, ref, hcg)
    model = fleet.distributed_model(model)
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    batches = data(3, 4)
    for i, (ids, labels) in enumerate(batches):
        if i == 2:
            dcp.save({"model": sharded_state_dict(model), "optim": sharded_optimizer_state_dict(model, opt)},
                     checkpoint_id=path)
        model(ids, labels).backward()
        opt.step()
        opt.clear_grad()
    return {k: v.clone() for k, v in model.state_dict().items()}, hcg.get_model_parallel_rank()


@pytest.mark.timeout(600)
def test_mp2_training_resumes_in_one_process_from_its_checkpoint(mp2):
    root, runs = mp2
    path = str(root / "resume")
    out = [r["resume"] for r in runs]
    ref = RefModel()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    state = {"model": ref.state_dict(), "optim": get_optimizer_state_dict(ref, opt)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=path, no_dist=True)  # mp 2 -> 1, the AdamW moments included
    ref.load_state_dict(state["model"])
    set_optimizer_state_dict(ref, opt, state["optim"])
    ids, labels = data(3, 4)[2]
    ref(ids, labels).backward()
    opt.step()
    for local, rank in out:
        for name, p in ref.named_parameters():
            axis = {"emb.weight": 0, "up.weight": 0, "up.bias": 0, "head.weight": 0, "down.weight": 1}.get(name)
            expected = p.detach() if axis is None else p.detach().chunk(2, dim=axis)[rank]
            assert (local[name] - expected).abs().max().item() <= 1e-6, name
