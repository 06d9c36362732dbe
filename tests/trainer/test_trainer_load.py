"""``Trainer.load`` accepts every checkpoint ``fit`` writes: a checkpoint file, a sharded (DCP)
checkpoint directory such as ``epoch-0001/``, the ``latest`` pointer of either kind, and the run's checkpoint
directory (its newest valid checkpoint); the weights equal those of the trained model."""

import os

import pytest
import torch
from trainer_helpers import dataset, params, trainer

from fleetlite.trainer import callbacks as C

# torch's notice for a single-process async DCP save, given from its writer thread (fleetlite silences the
# synchronous ones; tests/distributed/sharding asserts that this one is still given)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")


def _trained(ckpt, async_save):
    t = trainer()
    t.fit(dataset(32), epochs=2, batch_size=8, verbose=0,
          callbacks=[C.ModelCheckpoint(str(ckpt), save_freq=1, async_save=async_save)])
    return params(t)


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("async_save", [False, True], ids=["files", "dcp-directories"])
def test_load_accepts_every_checkpoint_fit_writes(tmp_path, async_save):
    done = _trained(tmp_path, async_save)
    names = sorted(os.listdir(tmp_path))
    last = "epoch-0001" if async_save else "epoch-0001.pt"
    pointer = "latest" if async_save else "latest.pt"
    assert last in names and pointer in names, names
    for target in (tmp_path / last, tmp_path / pointer, tmp_path):
        fresh = trainer(seed=1)
        fresh.fit(dataset(8), epochs=1, batch_size=8, verbose=0)  # other weights, a stepped optimizer
        assert not _same(params(fresh), done)
        fresh.load(target)
        assert _same(params(fresh), done), target
    weights_only = trainer()
    weights_only.load(tmp_path / last, reset_optimizer=True)
    assert _same(params(weights_only), done)


def test_load_still_takes_a_plain_state_dict_file_and_a_name_without_pt(tmp_path):
    source = trainer(seed=3)
    torch.save(source.network.state_dict(), tmp_path / "w.pt")
    for target in (tmp_path / "w.pt", tmp_path / "w"):  # NAME finds NAME.pt
        fresh = trainer(seed=4)
        fresh.load(target)
        assert _same(params(fresh), params(source))
