"""Fleetlite.Model under sharding stages 1, 2 and 3: ``fit(..., save_dir=d)``, ``save(path)``
and ``load(path)`` are collective where they must be (every rank joins the gather of the sharded weights and
optimizer state, rank 0 writes), so they neither hang nor abort; the files hold the full state, equal to what a
plain (unsharded) run of the same model saves."""

import os

import numpy as np
import pytest
import torch

from fleetlite.testing import run_ranks


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 10))


class _Data(torch.utils.data.Dataset):
    def __init__(self, n=32):
        g = np.random.default_rng(0)
        self.x = g.random((n, 20)).astype(np.float32)
        self.y = g.integers(0, 10, (n,)).astype(np.int64)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _run(rank, world, root, stage):
    import fleetlite
    import fleetlite.distributed.fleet as fleet
    from fleetlite.distributed.fleet import fleet as fleet_impl

    torch.set_num_threads(1)
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy(sharding=True, sharding_configs={"stage": stage}) if stage else None
    fleet.init(is_collective=True, strategy=strategy)
    net = _net()
    model = fleetlite.Model(net)
    model.prepare(torch.optim.AdamW(net.parameters(), lr=0.01), torch.nn.CrossEntropyLoss())
    model.fit(_Data(), batch_size=8 // world, epochs=2, shuffle=False, save_dir=f"{root}/fit", verbose=0)
    model.save(f"{root}/saved")
    model.save(f"{root}/infer", training=False)  # the inference weights: gathered from the shards as well
    weights = model.trainer.get_weights()
    net2 = _net()
    other = fleetlite.Model(net2)
    other.prepare(torch.optim.AdamW(net2.parameters(), lr=0.01), torch.nn.CrossEntropyLoss())
    other.load(f"{root}/saved")  # collective under sharding too
    loaded = other.trainer.get_weights()
    return {k: v.detach().clone() for k, v in weights.items()}, {k: v.detach().clone() for k, v in loaded.items()}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_model_saves_and_loads_under_sharding(tmp_path, stage):
    ref_w, _ = _run(0, 1, str(tmp_path / "ref"), None)  # one process, no sharding: the reference files
    ref_opt = torch.load(tmp_path / "ref" / "saved.pdopt", weights_only=True)
    results = run_ranks(_run, args=(str(tmp_path / "sh"), stage), world_size=2, timeout=220)
    assert sorted(os.listdir(tmp_path / "sh" / "fit")) == ["0.pdopt", "0.pdparams", "1.pdopt", "1.pdparams",
                                                            "final.pdopt", "final.pdparams"]
    saved = torch.load(tmp_path / "sh" / "saved.pdparams", weights_only=True)
    opt = torch.load(tmp_path / "sh" / "saved.pdopt", weights_only=True)
    assert sorted(opt["state"]) == sorted(ref_opt["state"])  # the full optimizer state, every parameter
    for k, v in ref_opt["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt["state"][k][name], v[name], rtol=1e-4, atol=1e-6)
    infer = torch.load(tmp_path / "sh" / "infer.pt", weights_only=True)["model"]
    for weights, loaded in results:
        for k in ref_w:
            torch.testing.assert_close(saved[k], weights[k])  # the file holds the full weights
            torch.testing.assert_close(infer[k], weights[k])
            torch.testing.assert_close(weights[k], ref_w[k], rtol=1e-4, atol=1e-6)  # = the plain run
            torch.testing.assert_close(loaded[k], weights[k])  # load() put them back on every rank
