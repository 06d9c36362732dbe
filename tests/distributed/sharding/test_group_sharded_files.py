"""``save_group_sharded_model`` writes what Paddle writes: ``model.pdmodel`` and ``model.pdopt``
are plain state dicts (Paddle's ``paddle.save(model._layer.state_dict())`` / ``optimizer._optim.state_dict()``),
so Paddle's reload idiom ``net.load_state_dict(paddle.load(path))`` works with ``torch.load`` on every rank."""

import pytest
import torch
import torch.nn.functional as F
from sharding_helpers import MLP, batch, max_diff

from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.sharding import group_sharded_parallel, save_group_sharded_model
from fleetlite.testing import run_ranks


def _save_then_reload(rank, world, root, level):
    fleet_impl._reset()
    torch.manual_seed(0)
    model, opt, _ = group_sharded_parallel(net := MLP(), torch.optim.AdamW(net.parameters(), lr=1e-2), level)
    for step in range(3):
        x, y = batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    save_group_sharded_model(model, root, optimizer=opt)
    full = model.state_dict()  # collective: the full weights on every rank
    plain = MLP()
    plain.load_state_dict(torch.load(f"{root}/model.pdmodel"))  # Paddle's idiom, unchanged
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    plain_opt.load_state_dict(torch.load(f"{root}/model.pdopt"))
    return max_diff(plain.state_dict(), full), sorted(plain_opt.state_dict()["state"])


@pytest.mark.timeout(200)
@pytest.mark.parametrize("level", ["os_g", "p_g_os"])
def test_paddle_reload_idiom_on_two_ranks(tmp_path, level):
    for diff, opt_keys in run_ranks(_save_then_reload, args=(str(tmp_path), level), timeout=180):
        assert diff == 0.0 and opt_keys == list(range(len(list(MLP().parameters()))))
    with pytest.raises(ValueError, match="takes a directory"):
        save_group_sharded_model(MLP(), tmp_path / "model.pdmodel")
