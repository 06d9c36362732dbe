"""No host sync inside a training step with the recipe's default callbacks, counted on the CPU.

A read of a device value on the host (``.item()``, ``bool(t)``, ``.cpu()``...) makes the host wait for the
device, so it cannot queue the next step's kernels while the GPU works. On a GPU that costs time; here the
calls are counted instead, so the rule holds without one: ``torch.Tensor.item/tolist/__bool__/__float__/
__int__/cpu/numpy/nonzero`` and ``torch.cuda.synchronize`` are wrapped, every call made from one of
fleetlite's files is recorded with the batch it happened in, and the batches between
progress lines (the only place allowed to read values, every ``log_freq`` batches and at an epoch's end) must
have none. The reference is the list of calls itself (a hand loop makes none), not fleetlite's opinion.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from trainer_helpers import dataset, mlp, trainer, xy

import fleetlite
from fleetlite.recipe.build import build_callbacks, build_scheduler
from fleetlite.recipe.schema import register_configs
from fleetlite.trainer import callbacks as C

CONF = Path(__file__).resolve().parents[2] / "conf"
PACKAGE = os.path.dirname(os.path.abspath(fleetlite.__file__)) + os.sep
METHODS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy", "nonzero")
LOG_FREQ, STEPS, EPOCHS = 4, 10, 2  # 10 batches an epoch: lines after batches 4, 8 and 10 of each epoch


class SyncCounter:
    """Wraps the host-reading calls; records ``(epoch, batch, file:line, call)`` for calls made by fleetlite."""

    def __init__(self, monkeypatch) -> None:
        self.where: tuple[int, int] | None = None  # (epoch, batch) of the running batch; None outside batches
        self.calls: list[tuple[tuple[int, int] | None, str, str]] = []
        for name in METHODS:
            monkeypatch.setattr(torch.Tensor, name, self._wrap(getattr(torch.Tensor, name), name))
        monkeypatch.setattr(torch.cuda, "synchronize", self._wrap(torch.cuda.synchronize, "cuda.synchronize"))

    @staticmethod
    def _caller() -> str | None:
        frame = sys._getframe(2)  # the code that made the call (torch's own, e.g. Adam reading its CPU step
        path = os.path.abspath(frame.f_code.co_filename)  # counter, is not fleetlite's: the GPU suite checks it)
        return f"{path[len(PACKAGE):]}:{frame.f_lineno}" if path.startswith(PACKAGE) else None

    def _wrap(self, original, name):
        counter = self

        def wrapper(*args, **kwargs):
            where = counter._caller()
            if where is not None:
                counter.calls.append((counter.where, where, name))
            return original(*args, **kwargs)

        return wrapper

    def between_lines(self) -> list[tuple[tuple[int, int] | None, str, str]]:
        """The calls made in a batch that prints no progress line."""
        return [c for c in self.calls if c[0] is not None and (c[0][1] + 1) % LOG_FREQ and c[0][1] + 1 != STEPS]


class Where(C.Callback):
    """Marks the running batch (from its ``on_train_batch_begin`` to the next one's)."""

    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def on_train_batch_begin(self, step, logs=None):
        self.counter.where = (self.trainer.epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        self.counter.where = None


def recipe_callbacks(run_dir: Path, optimizer) -> list:
    """What ``recipes/cifar10.py`` passes to fit with its default config (LR schedule, run log, metrics.csv,
    checkpoints, TerminateOnNaN, pre-emption); the progress bar is fit's own (``verbose=1``)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("cifar10", overrides=["sched=onecycle"])
    scheduler = build_scheduler(cfg.sched, optimizer, EPOCHS, STEPS)
    cbs = build_callbacks(cfg.trainer, run_dir, scheduler)
    kinds = {type(cb).__name__ for cb in cbs}
    assert {"LRScheduler", "CSVLogger", "ModelCheckpoint", "TerminateOnNaN", "Preemption"} <= kinds, kinds
    return cbs


@pytest.mark.parametrize("verbose", [1, 2])
def test_the_recipe_callbacks_make_no_host_sync_between_progress_lines(tmp_path, monkeypatch, capsys, verbose):
    t = trainer(metrics=True)
    cbs = recipe_callbacks(tmp_path, t.user_optimizer)
    counter = SyncCounter(monkeypatch)
    t.fit(dataset(STEPS * 8), epochs=EPOCHS, batch_size=8, shuffle=True, log_freq=LOG_FREQ, verbose=verbose,
          callbacks=[Where(counter), *cbs])
    assert t.global_step == EPOCHS * STEPS
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " step " in ln]
    assert len(lines) == EPOCHS * 3, lines  # the progress lines were printed, so values were read there
    assert counter.calls, "the counter saw no call at all: the wrapping is broken"
    assert counter.between_lines() == [], sorted({c[1:] for c in counter.between_lines()})


def test_the_counter_sees_a_per_step_read_in_fleetlite(tmp_path, monkeypatch):
    """The counter's own check: a per-step ``bool()`` in a fleetlite callback (Keras' way of checking the loss)
    is caught with the batch it was made in."""

    class Eager(C.TerminateOnNaN):
        def on_train_batch_end(self, step, logs=None):
            bool(torch.isfinite(logs["loss"]))

    Eager.on_train_batch_end.__code__ = Eager.on_train_batch_end.__code__.replace(
        co_filename=os.path.join(PACKAGE, "trainer", "callbacks", "eager.py"))
    t = trainer()
    counter = SyncCounter(monkeypatch)
    t.fit(dataset(STEPS * 8), epochs=1, batch_size=8, log_freq=LOG_FREQ, verbose=0,
          callbacks=[Where(counter), Eager()])
    found = counter.between_lines()
    assert [c[0] for c in found] == [(0, b) for b in range(STEPS) if (b + 1) % LOG_FREQ and b + 1 != STEPS]
    assert all(c[1].startswith(os.path.join("trainer", "callbacks", "eager.py")) and c[2] == "__bool__"
               for c in found), found


class NaNFromStep(fleetlite.Trainer):
    """The loss reported from optimizer step ``bad`` on is NaN (the weights stay finite)."""

    bad = 6

    def train_step(self, batch):
        out = super().train_step(batch)
        return {"loss": out["loss"] * float("nan")} if self.global_step + 1 >= self.bad else out


@pytest.mark.parametrize("check_freq", [1, 4])
@pytest.mark.parametrize("first", [True, False])
def test_no_checkpoint_follows_a_non_finite_loss_the_verdict_read_late_or_not(tmp_path, first, check_freq):
    """The verdict is read one step late, except before a save (Note [non-finite loss]): a save due at the bad
    step 6 is dropped and training stops there, whatever the callbacks' order or ``check_freq``; without a save
    at the bad step 7 the stop comes one step later (a hand loop checking each step would stop at 7)."""
    for bad, stop in ((6, 6), (7, 8 if check_freq == 1 else 9)):
        t = trainer(cls=NaNFromStep)
        t.bad = bad
        nan = C.TerminateOnNaN(check_freq=check_freq)
        saving = C.ModelCheckpoint(str(tmp_path / str(bad)), save_freq=None, save_steps=3)
        t.fit(dataset(160), epochs=1, batch_size=8, verbose=0, callbacks=[nan, saving] if first else [saving, nan])
        saved = sorted(p.name for p in (tmp_path / str(bad)).glob("step-*"))
        assert saved == ["step-00000003.pt"] + (["step-00000006.pt"] if bad == 7 else []), saved
        assert t.terminated_on_nan == (bad if check_freq == 1 or bad == 6 else 8)
        assert t.global_step == stop


def test_a_progress_line_reads_its_values_in_one_copy(monkeypatch, capsys):
    """verbose=1 reads a line's loss and metrics in one copy (non-blocking on a GPU), not one ``.item()`` per value,
    and nothing in the batches between lines; the printed values are the epoch's running ones."""
    t = trainer()
    counter = SyncCounter(monkeypatch)
    t.fit(dataset(STEPS * 8), epochs=1, batch_size=8, shuffle=False, log_freq=LOG_FREQ, verbose=1,
          callbacks=[Where(counter)])
    progress = [c for c in counter.calls if c[1].startswith(os.path.join("trainer", "callbacks")) and c[0]]
    # per line, at the line's batch: one copy of all values (.cpu(); a non-blocking copy on a GPU), then the
    # host copy read out (.tolist() of host memory); before, one .item() per value
    assert [(c[0][1], c[2]) for c in progress] == [(b, m) for b in (3, 7, 9) for m in ("cpu", "tolist")], progress
    first = next(ln for ln in capsys.readouterr().out.splitlines() if " step 4/" in ln)
    net = mlp(0)  # a hand loop: the running mean of the first four batches' losses
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    x, y = xy(STEPS * 8)
    losses = []
    for i in range(4):
        loss = torch.nn.functional.cross_entropy(net(x[8 * i:8 * i + 8]), y[8 * i:8 * i + 8])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert f"loss: {sum(losses) / 4:.4f} - acc_top1: " in first, first


class TensorMaking:
    """Counts the tensors fleetlite makes from host data (``torch.tensor/as_tensor/from_numpy``) while iterating."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[str] = []
        for name in ("tensor", "as_tensor", "from_numpy"):
            monkeypatch.setattr(torch, name, self._wrap(getattr(torch, name), name))

    def _wrap(self, original, name):
        def wrapper(*args, **kwargs):
            path = os.path.abspath(sys._getframe(1).f_code.co_filename)
            if path.startswith(PACKAGE):
                self.calls.append(f"{path[len(PACKAGE):]}:{name}")
            return original(*args, **kwargs)

        return wrapper


def test_fit_on_tensors_indexes_them_with_one_host_copy_per_epoch(monkeypatch):
    """``fit((x, y))``: each batch's indices are a slice of the pass's order, sent to the data's device once per
    epoch, not an index tensor made on the host per batch; the batches are those of the sampler's order."""
    from fleetlite.io import DistributedBatchSampler
    from fleetlite.trainer.data_adapter import build_adapter

    x, y = xy(83)
    adapter = build_adapter((x, y), batch_size=8, shuffle=True, seed=3)
    reference = DistributedBatchSampler(range(83), 8, num_replicas=1, rank=0, shuffle=True, seed=3)
    made = TensorMaking(monkeypatch)
    for epoch in (0, 1):
        adapter.set_epoch(epoch)
        reference.set_epoch(epoch)
        got = list(adapter)
        want = list(reference)
        assert len(got) == len(want) == 11
        for (xb, yb), idx in zip(got, want):
            torch.testing.assert_close(xb, x[idx], rtol=0, atol=0)
            torch.testing.assert_close(yb, y[idx], rtol=0, atol=0)
    assert len(made.calls) == 2, made.calls  # one per epoch (before: one per batch)


def test_tensor_loader_makes_one_index_and_one_augmentation_copy_per_epoch(monkeypatch):
    """TensorLoader: the pass's order and the epoch's augmentation table each go to its device in one copy (from
    pinned memory on a GPU), nothing per batch; the batches are those of the per-batch reference computation."""
    from fleetlite.io import DistributedBatchSampler, TensorLoader
    from fleetlite.io.image_ops import crop_flip, normalize
    from fleetlite.vision.datasets import SyntheticCifar10

    images, labels = SyntheticCifar10(size=100).as_tensors()
    loader = TensorLoader(images, labels, batch_size=16, num_replicas=1, rank=0, seed=5)
    next(iter(loader))  # warm-up: the normalisation constants
    loader.set_epoch(1)
    made = TensorMaking(monkeypatch)
    got = list(loader)
    assert len(made.calls) == 2, made.calls  # the order and the augmentation table (before: 3 + one per batch)
    import numpy as np  # the reference: Note [augmentation seeds]'s tables, one index tensor per batch

    rng = np.random.default_rng([5, 1, 1])
    dy, dx, flip = (rng.integers(0, 9, 100), rng.integers(0, 9, 100), rng.integers(0, 2, 100).astype(bool))
    monkeypatch.undo()
    sampler = DistributedBatchSampler(range(100), 16, num_replicas=1, rank=0, shuffle=True, seed=5)
    sampler.set_epoch(1)
    for (xb, yb), idx in zip(got, sampler, strict=True):
        i = torch.tensor(idx)
        want = crop_flip(images[i], torch.from_numpy(dy)[i], torch.from_numpy(dx)[i], torch.from_numpy(flip)[i], 4)
        torch.testing.assert_close(xb, normalize(want, (0.0,) * 3, (1.0,) * 3, False), rtol=0, atol=0)
        torch.testing.assert_close(yb, labels[i], rtol=0, atol=0)
