"""Trainer.get_weights/set_weights under sharding stage 2/3 give and take full (unsharded) weights, as a plain
data-parallel run does."""

import pytest
import torch
from parity import max_abs_diff
from sharding_helpers import IndexedDataset
from torch import nn

import fleetlite
from fleetlite.testing import run_ranks


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def _data():
    d = IndexedDataset(16)
    return torch.utils.data.TensorDataset(d.x, d.y)


def _weights(rank, world, stage):
    torch.set_num_threads(1)
    strategy = None if stage is None else {"sharding": True, "sharding_configs": {"stage": stage}}
    net = _net()
    t = fleetlite.Trainer(net, torch.optim.AdamW(net.parameters(), lr=0.02), nn.CrossEntropyLoss(),
                          strategy=strategy, device="cpu")
    t.fit(_data(), epochs=1, batch_size=4, verbose=0)
    trained = t.get_weights()  # collective under stage 2/3
    t.set_weights({k: torch.full_like(v, 0.5) for k, v in trained.items()})
    after_set = t.get_weights()
    t.set_weights(trained)
    logs = t.evaluate(_data(), batch_size=4, verbose=0)
    return trained, after_set, logs["loss"]


@pytest.mark.timeout(200)
def test_get_and_set_weights_are_full_under_stage2_and_stage3(clean_dist_env):
    ddp = run_ranks(_weights, args=(None,), timeout=100)
    for stage in (2, 3):
        for (trained, after_set, loss), (ref, _, ref_loss) in zip(run_ranks(_weights, args=(stage,), timeout=100),
                                                                   ddp):
            assert set(trained) == set(ref) and all(trained[k].shape == ref[k].shape for k in ref)
            assert max_abs_diff(ref, trained) <= 1e-6
            assert all(torch.equal(v, torch.full_like(v, 0.5)) for v in after_set.values())
            assert loss == pytest.approx(ref_loss, rel=1e-5)  # the trained weights went back into the shards
