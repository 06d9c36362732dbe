"""Under sharding stages 1, 2 and 3 a resumed run's LR scheduler steps the optimizer that trains,
so an interrupted and resumed run ends where the uninterrupted one does (as data parallel does, bit for bit),
through ``Trainer.fit(resume=...)`` and through a Paddle-style hand loop calling ``opt.load_state_dict``."""

import pytest
import torch
import torch.nn.functional as F
from sharding_helpers import MLP, IndexedDataset, StopAt, batch, sharded
from torch import nn

import fleetlite
import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.testing import run_ranks
from fleetlite.trainer import callbacks as C


class _Trainer(fleetlite.Trainer):
    def train_step(self, batch):
        x, y, _ = batch
        return super().train_step((x, y))


def _fit(ckpt, stage, stop=None, resume=None):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    strategy = {"sharding": True, "sharding_configs": {"stage": stage}} if stage else None
    t = _Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(), strategy=strategy,
                          device="cpu")
    sched = torch.optim.lr_scheduler.StepLR(t.user_optimizer, step_size=1, gamma=0.5)
    cbs = [C.LRScheduler(sched, by_step=True), C.ModelCheckpoint(ckpt, save_freq=None, save_steps=1)]
    cbs += [StopAt(stop)] if stop else []
    t.fit(IndexedDataset(32), epochs=2, batch_size=4, callbacks=cbs, resume=resume, verbose=0)

    lrs = [g["lr"] for g in t.optimizer.param_groups]
    return {k: v.clone() for k, v in t.checkpoint_connector.model_state(rank0_only=False).items()}, lrs, t.global_step


def _trainer_resume(rank, world, root, stage):
    torch.set_num_threads(1)
    straight, lr_straight, _ = _fit(f"{root}/straight", stage)
    _fit(f"{root}/b", stage, stop=3)
    resumed, lr_resumed, steps = _fit(f"{root}/b", stage, resume="latest")
    return all(torch.equal(straight[k], resumed[k]) for k in straight), lr_straight, lr_resumed, steps


@pytest.mark.timeout(200)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_trainer_resume_under_sharding_equals_the_uninterrupted_run(tmp_path, stage):
    for same, lr_straight, lr_resumed, steps in run_ranks(_trainer_resume, args=(str(tmp_path), stage), timeout=190):
        assert lr_resumed == lr_straight and steps == 8
        assert same


def _hand_loop(stage, steps, state=None):
    """``steps`` Paddle-style steps with a per-step StepLR; ``state`` = (model, optimizer, scheduler) to load first."""
    fleet_impl._reset()
    fleet.init(is_collective=True, strategy=sharded(stage))
    torch.manual_seed(0)
    model = fleet.distributed_model(MLP())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)  # on the torch optimizer, as users do
    opt = fleet.distributed_optimizer(sgd)
    start = 0
    if state is not None:
        model.set_state_dict(state[0])
        opt.load_state_dict(state[1])
        sched.load_state_dict(state[2])
        start = state[3]
    rank = torch.distributed.get_rank()
    for step in range(start, steps):
        x, y = batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.clear_grad()
        sched.step()
    return model, opt, sched


def _hand(rank, world, stage):
    torch.set_num_threads(1)
    model, opt, _ = _hand_loop(stage, 6)
    straight = {k: v.clone() for k, v in _full(model).items()}
    lr_straight = opt.get_lr()
    model, opt, sched = _hand_loop(stage, 3)
    saved = (_full(model), opt.state_dict(), sched.state_dict(), 3)
    model, opt, _ = _hand_loop(stage, 6, state=saved)
    resumed = _full(model)
    return all(torch.equal(straight[k], resumed[k]) for k in straight), lr_straight, opt.get_lr()


def _full(model):
    return model.full_state_dict(rank0_only=False) if hasattr(model, "full_state_dict") else model.state_dict()


@pytest.mark.timeout(200)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_hand_loop_load_state_dict_under_sharding_keeps_the_scheduler_on_the_optimizer(stage):
    for same, lr_straight, lr_resumed in run_ranks(_hand, args=(stage,), timeout=190):
        assert lr_resumed == lr_straight
        assert same
