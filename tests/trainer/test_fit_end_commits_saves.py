"""Every way a fit ends settles an asynchronous save in flight (Note [saves in flight]): a stop on
a non-finite loss (TerminateOnNaN, either ``raise_error``) and ``stop_training`` commit it and point ``latest`` at
it; another exception leaves it uncommitted and says so."""

import os

import pytest
import torch
from trainer_helpers import dataset, trainer

import fleetlite
import fleetlite.checkpoint as ckpt
from fleetlite.trainer import callbacks as C

# torch's notice for a single-process async DCP save, given from its writer thread (fleetlite silences the
# synchronous ones; tests/distributed/sharding asserts that this one is still given)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")


class NaNAtStep6(fleetlite.Trainer):
    """The 6th step's loss is reported as NaN (the weights stay finite: what is saved before it is checkable)."""

    def train_step(self, batch):
        out = super().train_step(batch)
        return {"loss": out["loss"] * float("nan")} if self.global_step == 5 else out


class Boom(C.Callback):
    def on_train_batch_end(self, step, logs=None):
        if self.trainer.global_step == 6:
            raise RuntimeError("boom")


def _fit(tmp_path, *cbs):
    t = trainer(cls=NaNAtStep6)
    saving = C.ModelCheckpoint(str(tmp_path), save_freq=None, save_steps=1, async_save=True)
    t.fit(dataset(80), epochs=1, batch_size=8, verbose=0, callbacks=[saving, *cbs])
    return t


def _committed(root):
    names = os.listdir(root)
    assert not [n for n in names if ".tmp-" in n], names  # nothing left half-written
    return (root / "latest").read_text().strip(), ckpt.find_newest(root, kind="dir").name


@pytest.mark.parametrize("raise_error", [False, True])
def test_a_nan_stop_commits_the_save_made_before_it(tmp_path, raise_error):
    if raise_error:
        with pytest.raises(C.NonFiniteLossError):
            _fit(tmp_path, C.TerminateOnNaN(raise_error=True))
    else:
        assert _fit(tmp_path, C.TerminateOnNaN()).terminated_on_nan == 6
    assert _committed(tmp_path) == ("step-00000005", "step-00000005")
    assert ckpt.validate(tmp_path / "step-00000005")["global_step"] == 5
    assert not (tmp_path / "step-00000006").exists()  # the bad step's own save request never ran


def test_stop_training_commits_the_save_in_flight(tmp_path):
    class Stop(C.Callback):
        def on_train_batch_end(self, step, logs=None):
            if self.trainer.global_step == 4:
                self.trainer.stop_training = True

    _fit(tmp_path, Stop())
    assert _committed(tmp_path) == ("step-00000004", "step-00000004")


def test_another_exception_says_the_save_in_flight_was_not_committed(tmp_path):
    with pytest.warns(UserWarning, match=r"RuntimeError while the asynchronous checkpoint .*step-00000005 was being "
                                         r"written; it was not committed"):
        with pytest.raises(RuntimeError, match="boom"):
            _fit(tmp_path, Boom())
    assert (tmp_path / "latest").read_text().strip() == "step-00000004"
    assert torch.is_tensor(ckpt.load_full(tmp_path)["0.weight"])  # the latest one is complete
