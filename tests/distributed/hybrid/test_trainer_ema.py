"""The EMA callback on hybrid models (mp = 2, pp = 2): the average of the full weights, validation with the
averaged weights (``eval_with_ema``) and ``copy_to`` equal one process training the same model on the same data,
within 1e-5 (Note [EMA under sharding]: a hybrid model takes the gathered-weights path)."""

import pytest
import torch
from hybrid_models import (
    N_EVAL,
    N_TRAIN,
    TOL,
    all_stage_weights,
    dataset,
    full_tp_weights,
    init_fleet,
    pipeline_stage,
    reference_net,
    tp_net,
)
from parity import max_abs_diff
from torch import nn

import fleetlite
from fleetlite.distributed import fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.testing import run_ranks
from fleetlite.trainer.callbacks import EMA

ROWS = 8


def _fit(net, strategy, loss):
    torch.set_num_threads(1)
    ema = EMA(0.8, eval_with_ema=True)
    t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9), loss,
                          metrics=fleetlite.metric.Accuracy(), strategy=strategy, device="cpu")
    history = t.fit(dataset(N_TRAIN, 1), eval_data=dataset(N_EVAL, 2), epochs=2, batch_size=ROWS, shuffle=True,
                    seed=3, verbose=0, callbacks=[ema])
    ema.copy_to(t.network)  # the averaged weights into the (sliced, staged) network
    return history.history


def _reference():
    fleet_impl._reset()
    net = reference_net()
    history = _fit(net, None, nn.CrossEntropyLoss())
    return history, {k: v.detach().clone() for k, v in net.state_dict().items()}


def _hybrid(rank, world, kind):
    if kind == "mp2":
        init_fleet({"dp_degree": 1, "mp_degree": 2, "pp_degree": 1})
        strategy = fleet.user_strategy()
        net = tp_net()
        history = _fit(net, strategy, nn.CrossEntropyLoss())
        return history, full_tp_weights(net)
    init_fleet({"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}, {"accumulate_steps": 2,
                                                                 "micro_batch_size": 4})
    strategy = fleet.user_strategy()
    loss = nn.CrossEntropyLoss()
    stage = pipeline_stage(loss)
    history = _fit(stage, strategy, loss)
    return history, all_stage_weights(stage)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["mp2", "pp2"])
def test_ema_of_a_hybrid_model_equals_one_process(kind):
    ref_history, ref_weights = _reference()
    for history, weights in run_ranks(_hybrid, 2, args=(kind,), timeout=240):
        for key in ("loss", "val_loss", "val_acc"):
            assert max_abs_diff(torch.tensor(history[key]), torch.tensor(ref_history[key])) <= TOL, (key, history)
        for k, w in ref_weights.items():
            assert (weights[k] - w).abs().max() <= TOL, k
