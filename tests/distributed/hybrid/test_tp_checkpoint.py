"""Tensor-parallel parameters checkpoint through DCP as DTensor shards and reshard: saved at mp = 2, loaded back
at mp = 2 and into a plain single-process model (mp = 1)."""

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from tp_models import RefModel, TPModel, init_mp

from fleetlite.distributed.fleet.meta_parallel import load_sharded_state_dict, sharded_state_dict
from fleetlite.testing import run_ranks


def _save_and_reload(rank, world, path):
    hcg = init_mp({"mp_degree": 2})
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
    back = max((model.state_dict()[k] - v).abs().max().item() for k, v in saved.items())
    return back, {k: v for k, v in saved.items()}, hcg.get_model_parallel_rank()


@pytest.mark.timeout(200)
def test_mp2_checkpoint_reloads_and_reshards_to_one_process(tmp_path):
    path = str(tmp_path / "ckpt")
    out = run_ranks(_save_and_reload, world_size=2, args=(path,), timeout=190)
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

