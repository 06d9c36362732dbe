"""Paddle's group_sharded_parallel / save_group_sharded_model at each level against torch DDP."""

import copy

import pytest
import torch
import torch.nn.functional as F
from sharding_helpers import MLP, batch, max_diff

from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.sharding import group_sharded_parallel, save_group_sharded_model
from fleetlite.testing import run_ranks


def _levels(rank, world, root):
    out = {}
    for level in ("os", "os_g", "p_g_os"):
        fleet_impl._reset()
        torch.manual_seed(0)
        net = MLP()
        ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net))
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        model, opt, scaler = group_sharded_parallel(net, torch.optim.AdamW(net.parameters(), lr=1e-2), level,
                                                    scaler=scaler)
        for step in range(10):
            x, y = batch(step, rank)
            for m, o in ((model, opt), (ref, ref_opt)):
                F.cross_entropy(m(x), y).backward()
                o.step()
                o.zero_grad()
        save_group_sharded_model(model, f"{root}/{level}", optimizer=opt)
        out[level] = (max_diff(model.state_dict(), ref.module.state_dict()), type(model).__name__,
                      type(scaler).__name__, {k: v.clone() for k, v in ref.module.state_dict().items()})
    with pytest.raises(ValueError, match="level='zero3' must be one of"):
        group_sharded_parallel(MLP(), torch.optim.SGD(MLP().parameters(), lr=0.1), "zero3")
    return out


@pytest.mark.timeout(200)
def test_each_level_matches_ddp_and_saves_full_weights(tmp_path):
    results = run_ranks(_levels, args=(str(tmp_path),), timeout=190)
    kinds = {"os": "DataParallel", "os_g": "ShardedDataParallel", "p_g_os": "ShardedDataParallel"}
    for level, kind in kinds.items():
        for result in results:
            diff, name, scaler, _ = result[level]
            assert diff <= 1e-6 and name == kind and scaler == "DistGradScaler", level
        # Paddle's files are plain state dicts: Paddle's reload idiom, net.load_state_dict(load(path))
        saved = torch.load(tmp_path / level / "model.pdmodel", weights_only=True)
        assert "format" not in saved and sorted(saved) == sorted(MLP().state_dict())
        plain = MLP()
        plain.load_state_dict(saved)  # the full weights load into a plain model
        assert max_diff(saved, results[0][level][3]) <= 1e-6
        opt_state = torch.load(tmp_path / level / "model.pdopt", weights_only=True)
        torch.optim.AdamW(plain.parameters()).load_state_dict(opt_state)  # torch's format
