"""Callbacks: hook order and logs, History, EarlyStopping, ModelCheckpoint (keep-k, best, latest, steps),
LRScheduler, CSVLogger, TensorBoard."""

import csv
import math
import os

import pytest
import torch
from trainer_helpers import dataset, trainer

import fleetlite
from fleetlite.checkpoint import load_checkpoint
from fleetlite.trainer import callbacks as C
from fleetlite.trainer.callbacks import paddle as P
from fleetlite.trainer.callbacks import tensorboard as tensorboard_callback


class Recorder(C.Callback):
    def __init__(self):
        super().__init__()
        self.events = []

    def _rec(self, name, arg=None, logs=None):
        self.events.append((name, arg, dict(logs or {})))

    def on_train_begin(self, logs=None): self._rec("train_begin")
    def on_train_end(self, logs=None): self._rec("train_end", logs=logs)
    def on_epoch_begin(self, epoch, logs=None): self._rec("epoch_begin", epoch)
    def on_epoch_end(self, epoch, logs=None): self._rec("epoch_end", epoch, logs)
    def on_train_batch_begin(self, step, logs=None): self._rec("batch_begin", step)
    def on_train_batch_end(self, step, logs=None): self._rec("batch_end", step, logs)
    def on_eval_begin(self, logs=None): self._rec("eval_begin")
    def on_eval_end(self, logs=None): self._rec("eval_end", logs=logs)
    def on_eval_batch_begin(self, step, logs=None): self._rec("eval_batch_begin", step)
    def on_eval_batch_end(self, step, logs=None): self._rec("eval_batch_end", step, logs)


def test_hooks_fire_in_order_with_keras_logs():
    t = trainer()
    rec = Recorder()
    hist = t.fit(dataset(20), eval_data=dataset(9, seed=2), epochs=2, batch_size=8, callbacks=[rec], verbose=0)
    names = [(n, a) for n, a, _ in rec.events]
    def epoch(e):
        batches = [x for i in range(3) for x in (("batch_begin", i), ("batch_end", i))]
        evals = [("eval_begin", None), ("eval_batch_begin", 0), ("eval_batch_end", 0), ("eval_batch_begin", 1),
                 ("eval_batch_end", 1), ("eval_end", None)]
        return [("epoch_begin", e)] + batches + evals + [("epoch_end", e)]

    assert names == [("train_begin", None)] + epoch(0) + epoch(1) + [("train_end", None)]
    batch_logs = [lg for n, _, lg in rec.events if n == "batch_end"]
    assert set(batch_logs[0]) == {"loss", "acc_top1", "acc_top2", "batch_size"}
    assert [lg["batch_size"] for lg in batch_logs[:3]] == [8, 8, 4]
    epoch_logs = [lg for n, _, lg in rec.events if n == "epoch_end"]
    assert set(epoch_logs[0]) == {"loss", "acc_top1", "acc_top2", "val_loss", "val_acc_top1", "val_acc_top2"}
    # the epoch loss is the sample-weighted mean of the batch losses (single process: the last running value)
    assert epoch_logs[1]["loss"] == pytest.approx(float(batch_logs[5]["loss"]), rel=1e-12)
    assert hist.history["val_loss"] == [lg["val_loss"] for lg in epoch_logs] and hist.epoch == [0, 1]
    final = t.evaluate(dataset(9, seed=2), batch_size=8, verbose=0)
    assert final == {"loss": epoch_logs[1]["val_loss"], "acc_top1": epoch_logs[1]["val_acc_top1"],
                     "acc_top2": epoch_logs[1]["val_acc_top2"]}


class FakeTrainer:
    def __init__(self):
        self.stop_training = False
        self.w = 0

    def get_weights(self):
        return {"w": torch.tensor(self.w)}

    def set_weights(self, w):
        self.w = int(w["w"])


def _drive(cb, values):
    fake = FakeTrainer()
    cb.set_model(fake)
    cb.on_train_begin()
    for e, v in enumerate(values):
        fake.w = e
        cb.on_epoch_end(e, {"val_loss": v})
        if fake.stop_training:
            break
    cb.on_train_end()
    return e, fake


def test_early_stopping_patience_min_delta_baseline_restore():
    e, _ = _drive(C.EarlyStopping(patience=2, verbose=0), [1.0, 0.9, 0.95, 0.91, 0.5])
    assert e == 3  # no improvement on epochs 2 and 3
    e, _ = _drive(C.EarlyStopping(patience=1, min_delta=0.2, verbose=0), [1.0, 0.9, 0.85])
    assert e == 1  # 0.9 is not better than 1.0 by more than 0.2
    e, _ = _drive(C.EarlyStopping(patience=2, baseline=0.5, verbose=0), [1.0, 0.9, 0.8, 0.7])
    assert e == 1  # improving, but two epochs short of the baseline
    stop = C.EarlyStopping(patience=1, restore_best_weights=True, verbose=0)
    e, fake = _drive(stop, [1.0, 0.2, 0.3, 0.4])
    assert e == 2 and stop.best == 0.2 and stop.best_epoch == 1 and fake.w == 1
    stop2 = C.EarlyStopping(monitor="val_acc", verbose=0)
    assert stop2.mode == "max"
    restored = C.EarlyStopping(patience=1, verbose=0)
    restored.load_state_dict(stop.state_dict())
    assert restored.best == 0.2 and restored.wait == stop.wait


def test_early_stopping_in_fit_stops_training():
    stop = C.EarlyStopping(monitor="loss", patience=0, min_delta=1e9, verbose=0)
    hist = trainer().fit(dataset(16), epochs=10, batch_size=8, callbacks=[stop], verbose=0)
    assert hist.epoch == [0, 1] and stop.stopped_epoch == 1
    with pytest.warns(UserWarning, match="not in the epoch logs"):
        trainer().fit(dataset(16), epochs=1, batch_size=8, callbacks=[C.EarlyStopping()], verbose=0)


def test_model_checkpoint_keep_last_best_latest_and_steps(tmp_path):
    ck = C.ModelCheckpoint(str(tmp_path), save_freq=1, save_steps=2, keep_last=2, monitor="val_acc_top1")
    t = trainer()
    hist = t.fit(dataset(24), eval_data=dataset(11, seed=2), epochs=4, batch_size=8, callbacks=[ck], verbose=0)
    files = sorted(os.listdir(tmp_path))
    assert files == ["best.pt", "epoch-0003.pt", "latest.pt", "step-00000012.pt"], files
    latest = load_checkpoint(tmp_path / "latest.pt")
    assert latest["progress"] == {"epoch": 3, "batch_in_epoch": 3, "epoch_finished": True, "pass_done": True,
                                  "global_step": 12,
                                  "accumulate_grad_batches": 1}
    for k, v in t.network.state_dict().items():
        assert torch.equal(latest["model"][k], v)
    accs = hist.history["val_acc_top1"]
    best_epoch = max(range(4), key=lambda e: (accs[e], -e))
    best = load_checkpoint(tmp_path / "best.pt")
    assert best["progress"]["epoch"] == best_epoch and ck.best == accs[best_epoch]
    assert best["callbacks"]["ModelCheckpoint"]["best"] == accs[best_epoch]
    with pytest.raises(ValueError, match="no directory"):
        trainer().fit(dataset(8), epochs=1, callbacks=[C.ModelCheckpoint()], verbose=0)


def test_fit_save_dir_adds_epoch_checkpoints(tmp_path):
    trainer().fit(dataset(16), epochs=2, batch_size=8, save_dir=tmp_path, verbose=0)
    assert sorted(os.listdir(tmp_path)) == ["epoch-0000.pt", "epoch-0001.pt", "latest.pt"]


def test_lr_scheduler_per_epoch_and_per_step():
    t = trainer(lr=0.08)
    sched = torch.optim.lr_scheduler.StepLR(t.user_optimizer, step_size=1, gamma=0.5)
    t.fit(dataset(20), epochs=3, batch_size=8, callbacks=[C.LRScheduler(sched)], verbose=0)
    assert t.user_optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    t = trainer(lr=0.08)
    sched = torch.optim.lr_scheduler.StepLR(t.user_optimizer, step_size=1, gamma=0.5)
    t.fit(dataset(20), epochs=1, batch_size=8, accumulate_grad_batches=2,
          callbacks=[C.LRScheduler(sched, by_step=True)], verbose=0)
    assert t.global_step == 2 and t.user_optimizer.param_groups[0]["lr"] == pytest.approx(0.02)
    with pytest.raises(TypeError, match="LR scheduler"):
        C.LRScheduler(object())


def test_csv_logger_rows_match_history(tmp_path):
    log = C.CSVLogger()
    hist = trainer().fit(dataset(16), eval_data=dataset(5), epochs=3, batch_size=8, save_dir=tmp_path,
                         callbacks=[log], verbose=0)
    with open(tmp_path / "training.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    for k, values in hist.history.items():
        assert [float(r[k]) for r in rows] == pytest.approx(values, rel=1e-12)
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_tensorboard_missing_package_message_and_writer(monkeypatch, tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install tensorboard"):
            C.TensorBoard()
    written = []

    class Writer:
        def __init__(self, log_dir):
            self.log_dir = log_dir

        def add_scalar(self, tag, value, step):
            written.append((tag, value, step))

        def flush(self): ...
        def close(self): ...

    monkeypatch.setattr(tensorboard_callback, "_summary_writer_class", lambda: Writer)
    hist = trainer().fit(dataset(16), epochs=2, batch_size=8, callbacks=[C.TensorBoard(str(tmp_path))], verbose=0)
    got = {(tag, step): v for tag, v, step in written}
    assert got[("epoch/loss", 1)] == hist.history["loss"][1] and ("epoch/acc_top2", 0) in got


def test_callback_list_state_keys_and_type_checks():
    cbs = C.CallbackList([C.History(), C.History(), Recorder()])
    assert cbs.keys() == ["History", "History#1", "Recorder"]
    with pytest.raises(TypeError, match="Callback instances"):
        C.CallbackList([object()])
    with pytest.warns(UserWarning, match="not passed to fit"):
        cbs.load_state_dict({**cbs.state_dict(), "Gone": {"x": 1}})
    # fleetlite.callbacks is Paddle's namespace, its ModelCheckpoint Paddle's class (was C.ModelCheckpoint)
    assert fleetlite.callbacks.ModelCheckpoint is P.ModelCheckpoint and not math.isnan(0.0)


def test_callback_list_writes_every_hook_out_and_public_names_are_callbacks():
    from fleetlite.trainer.callbacks.base import HOOKS

    assert all(name in C.CallbackList.__dict__ for name in HOOKS)  # go-to-definition finds each hook
    for name in fleetlite.callbacks.__all__:
        obj = getattr(fleetlite.callbacks, name)
        assert issubclass(obj, (C.Callback, C.CallbackList, C.NonFiniteLossError)), name
    assert not hasattr(fleetlite.callbacks, "build_callbacks") and not hasattr(fleetlite.callbacks, "atomic_write_text")
