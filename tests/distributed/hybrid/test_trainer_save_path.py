"""A hybrid (tensor-parallel) model's ``Trainer.save("ck/manual.pt")`` writes a DCP directory (``ck/manual/``, Note
[hybrid checkpoints in the Trainer]); ``Trainer.load("ck/manual.pt")``, the path given to save, loads it: the weights
equal one process's that trained and saved under the same path."""

import pytest
import torch
from hybrid_models import dataset, full_tp_weights, init_fleet, reference_net, tp_net

import fleetlite
from fleetlite.distributed import fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.testing import run_ranks

DEGREES = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 1}


def _trainer(net, strategy):
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    return fleetlite.Trainer(net, opt, torch.nn.CrossEntropyLoss(), strategy=strategy, device="cpu")


def _one_process(path):
    fleet_impl._reset()
    net = reference_net()
    t = _trainer(net, None)
    t.fit(dataset(16, 1), batch_size=8, epochs=1, verbose=0)
    t.save(path)
    fresh = reference_net()
    _trainer(fresh, None).load(path)
    return {k: v.detach().clone() for k, v in fresh.named_parameters()}


def _mp2(rank, world, path):
    torch.set_num_threads(1)
    init_fleet(DEGREES)
    strategy = fleet.user_strategy()
    t = _trainer(tp_net(), strategy)
    t.fit(dataset(16, 1), batch_size=8, epochs=1, verbose=0)
    written = t.save(path)
    fresh = tp_net()  # the untrained weights: load must replace them
    _trainer(fresh, strategy).load(path)
    return str(written), full_tp_weights(fresh)


@pytest.mark.timeout(300)
def test_hybrid_trainer_loads_the_path_given_to_save(tmp_path):
    ref = _one_process(str(tmp_path / "one" / "manual.pt"))
    path = tmp_path / "ck" / "manual.pt"
    results = run_ranks(_mp2, 2, args=(str(path),), timeout=300)
    for written, weights in results:
        assert written == str(tmp_path / "ck" / "manual")
        assert sorted(weights) == sorted(ref)
        for k in ref:
            torch.testing.assert_close(weights[k], ref[k], rtol=1e-5, atol=1e-5)
