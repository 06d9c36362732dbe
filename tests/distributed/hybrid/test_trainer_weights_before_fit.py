"""``Trainer.get_weights()`` / ``set_weights()`` on a tensor-parallel model (mp = 2) before ``fit``: the full
weights, as after ``fit``, not this rank's slices.

Reference: the single-process model the slices were cut from (``hybrid_models.reference_net``), compared on
every rank."""

import pytest
import torch
from hybrid_models import full_tp_weights, init_fleet, reference_net, tp_net

import fleetlite
from fleetlite.distributed import fleet
from fleetlite.testing import run_ranks


def _before_fit(rank, world):
    torch.set_num_threads(1)
    init_fleet({"dp_degree": 1, "mp_degree": 2, "pp_degree": 1})
    strategy = fleet.user_strategy()
    net = tp_net()
    t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), torch.nn.CrossEntropyLoss(),
                          strategy=strategy, device="cpu")
    got = t.get_weights()  # before fit: nothing wrapped yet
    new = {k: v + 1.0 for k, v in got.items()}
    t.set_weights(new)  # full weights in: each rank keeps its slices
    return got, full_tp_weights(net, rename=False), t.get_weights()


@pytest.mark.timeout(240)
def test_get_and_set_weights_before_fit_are_full_on_every_rank():
    ref = {f"l{k}": v for k, v in reference_net().state_dict().items()}  # TPNet's l0 is the reference's 0
    for got, after_set, again in run_ranks(_before_fit, 2):
        assert sorted(got) == sorted(ref)
        for k, v in ref.items():
            torch.testing.assert_close(got[k], v, rtol=0, atol=0)
            torch.testing.assert_close(after_set[k], v + 1.0, rtol=0, atol=0)  # gathered independently of the Trainer
            torch.testing.assert_close(again[k], v + 1.0, rtol=0, atol=0)
