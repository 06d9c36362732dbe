"""Trainer(compile=True) under sharding stage 3 trains uncompiled (torch.compile never runs on the FSDP2-sharded
module: no frame captured), and says so at the start instead of silently."""

import warnings

import torch
from torch import nn

from fleetlite.testing import run_ranks


def _fit(rank, world):
    from torch._dynamo.utils import counters

    import fleetlite

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), nn.CrossEntropyLoss(), device="cpu",
                          strategy={"sharding": True, "sharding_configs": {"stage": 3}}, compile=True)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit((x, y), epochs=1, batch_size=8, verbose=0)
    said = [str(w.message) for w in caught if "compile=" in str(w.message)]
    return t.parallel_network.is_sharded, counters["stats"].get("calls_captured", 0), said


def test_compile_under_stage3_warns_that_it_runs_uncompiled():
    (sharded, captured, said), (_, _, said1) = run_ranks(_fit, timeout=200)
    assert sharded and captured == 0  # what the warning states: nothing was compiled
    assert len(said) == 1 and "no effect under sharding stage 2/3" in said[0]
    assert said1 == []  # rank 0 says it once
