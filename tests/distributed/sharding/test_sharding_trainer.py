"""The Trainer under sharding stages 2/3: checkpoints of a stage-3 run resume bit-identically at the same world
size and stage, and on one process with every remaining sample seen once."""

import pytest
import torch
from sharding_helpers import IndexedDataset, StopAt
from torch import nn

import fleetlite
from fleetlite.testing import run_ranks
from fleetlite.trainer import callbacks as C

STAGE3 = {"sharding": True, "sharding_configs": {"stage": 3}}


class Recording(fleetlite.Trainer):
    def train_step(self, batch):
        x, y, idx = batch
        self.__dict__.setdefault("seen", []).extend(idx.tolist())
        return super().train_step((x, y))


def _fit(ckpt, stop=None, resume=None, strategy=STAGE3, epochs=2, async_save=False):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    t = Recording(net, torch.optim.AdamW(net.parameters(), lr=0.02), nn.CrossEntropyLoss(), strategy=strategy,
                  device="cpu")
    t.seen = []
    kw = {"async_save": True} if async_save else {}
    cbs = [C.ModelCheckpoint(ckpt, save_freq=None, save_steps=1, keep_last=2, **kw)]
    cbs += [StopAt(stop)] if stop else []
    t.fit(IndexedDataset(40), epochs=epochs, batch_size=4, callbacks=cbs, resume=resume, verbose=0)
    from fleetlite.trainer.state import model_state

    return t.seen, t.global_step, model_state(t, rank0_only=False)


def _same_world(rank, world, root, async_save):
    torch.set_num_threads(1)
    _, _, straight = _fit(f"{root}/straight", async_save=async_save)
    _fit(f"{root}/b", stop=3, async_save=async_save)
    _, steps, resumed = _fit(f"{root}/b", resume="latest", async_save=async_save)
    return all(torch.equal(straight[k], resumed[k]) for k in straight), steps


@pytest.mark.timeout(200)
@pytest.mark.parametrize("async_save", [False])
def test_stage3_resume_is_bit_identical_at_the_same_world_and_stage(tmp_path, async_save):
    for same, steps in run_ranks(_same_world, args=(str(tmp_path), async_save), timeout=190):
        assert same and steps == 10


def _part(rank, world, ckpt):
    torch.set_num_threads(1)
    seen, steps, _ = _fit(ckpt, stop=2)
    return seen


@pytest.mark.timeout(200)
def test_stage3_checkpoint_of_two_ranks_resumes_on_one_process_seeing_each_sample_once(tmp_path, clean_dist_env):
    ckpt = str(tmp_path / "ck")
    before = [i for seen in run_ranks(_part, args=(ckpt,), timeout=120) for i in seen]
    assert len(set(before)) == 16
    with pytest.warns(UserWarning):
        after, steps, weights = _fit(ckpt, resume="latest")
    assert sorted(before + after[:24]) == list(range(40))
    assert sorted(after[24:]) == list(range(40)) and steps == 2 + 6 + 10
    assert all(torch.isfinite(v).all() for v in weights.values())
