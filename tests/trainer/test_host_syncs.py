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
from trainer_helpers import dataset, trainer

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
