"""``PipelineLayer(num_stages=1)`` in one process (the one-process form of a pipeline model) trains as any module,
as in Paddle (where ``distributed_model`` gives a ``pp_degree = 1`` model to DataParallel): its fit equals a plain
torch loop over the same layers. So a pp2 checkpoint of a tied-weight model (``SharedLayerDesc``: the embedding and
the output head) loads into one process through ``Trainer.load``: the weights are the pp2 run's, the tied weight
once, and its evaluation equals the pp2 run's."""

import os
import sys

import pytest
import torch
import torch.distributed as td
from torch import nn

import fleetlite
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import PipelineLayer
from fleetlite.testing import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "distributed", "hybrid"))
from hybrid_models import PP_VOCAB as VOCAB  # noqa: E402
from hybrid_models import copy_from, mlp_descs, reference, tied_descs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
ROWS, EPOCHS = 8, 2


def _mlp_data():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(32, 6, generator=g)
    return x, torch.randint(0, 4, (32,), generator=g)


def test_one_stage_pipeline_layer_trains_as_any_module():
    fleet_impl._reset()
    x, y = _mlp_data()
    stage = PipelineLayer(mlp_descs(), num_stages=1, loss_fn=nn.CrossEntropyLoss())
    ref = reference("mlp")  # the same layers by hand, for a plain torch loop
    copy_from(stage, ref)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_losses = []
    for _ in range(EPOCHS):
        total = 0.0
        for i in range(0, 32, ROWS):
            loss = nn.functional.cross_entropy(ref(x[i:i + ROWS]), y[i:i + ROWS])
            ref_opt.zero_grad()
            loss.backward()
            ref_opt.step()
            total += loss.item()
        ref_losses.append(total / (32 // ROWS))
    t = fleetlite.Trainer(stage, torch.optim.SGD(stage.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                          device="cpu")
    history = t.fit((x, y), epochs=EPOCHS, batch_size=ROWS, shuffle=False, verbose=0).history
    torch.testing.assert_close(torch.tensor(history["loss"]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(stage.state_dict()[k], v, rtol=1e-5, atol=1e-6)


def _tied_loss(logits, y):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def _tied_data():
    g = torch.Generator().manual_seed(7)
    x1 = torch.randint(0, VOCAB, (32, 3), generator=g)
    x2 = torch.randint(0, 5, (32, 3), generator=g)
    return x1, x2, torch.randint(0, VOCAB, (32, 3), generator=g)


def _pp2_tied(rank, world, save_dir):
    from hybrid_models import init_fleet

    torch.set_num_threads(1)
    init_fleet({"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}, {"accumulate_steps": 2, "micro_batch_size": ROWS // 2})
    strategy = fleet_impl.user_strategy()
    ref = reference("tied")
    stage = PipelineLayer(tied_descs(), loss_fn=_tied_loss, topology=fleet_impl.get_hybrid_communicate_group()
                          .topology())
    copy_from(stage, ref)
    t = fleetlite.Trainer(stage, torch.optim.SGD(stage.parameters(), lr=0.1, momentum=0.9), strategy=strategy,
                          device="cpu")
    t.fit(_tied_data(), epochs=EPOCHS, batch_size=ROWS, shuffle=False, verbose=0, save_dir=save_dir)
    parts = [None] * world
    td.all_gather_object(parts, {k: v.detach().clone() for k, v in stage.state_dict().items()})
    return {k: v for p in parts for k, v in p.items()}, t.evaluate(_tied_data(), batch_size=ROWS, verbose=0)


@pytest.mark.timeout(300)
def test_tied_pp2_checkpoint_loads_into_one_process_through_the_trainer(tmp_path):
    results = run_ranks(_pp2_tied, 2, args=(str(tmp_path),), timeout=240)
    weights, evaluation = results[0]
    fleet_impl._reset()
    torch.manual_seed(123)  # other initial weights: the load must replace every one
    one = PipelineLayer(tied_descs(), num_stages=1, loss_fn=_tied_loss)
    t = fleetlite.Trainer(one, torch.optim.SGD(one.parameters(), lr=0.1, momentum=0.9), _tied_loss, device="cpu")
    t.load(tmp_path / f"epoch-{EPOCHS - 1:04d}")
    mine = one.state_dict()
    assert sorted(mine) == sorted(weights)  # the tied weight once: shared_layers.embed...
    for k, v in weights.items():
        torch.testing.assert_close(mine[k], v, rtol=0, atol=0)
    got = t.evaluate(_tied_data(), batch_size=ROWS, verbose=0)
    for r in results:
        torch.testing.assert_close(torch.tensor(got["loss"]), torch.tensor(r[1]["loss"]), rtol=1e-5, atol=1e-6)
