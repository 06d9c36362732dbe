"""What a new user and an adversarial tester broke, one process: each test reproduces the failure.

Wrong numbers or deep tracebacks become clear errors raised before any work; broken checkpoint files
become ``CheckpointError`` and resume falls back; a finished run resumes to nothing left to train."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import trainer_helpers as helpers
from torch import nn
from torch.utils.data import DataLoader
from trainer_helpers import dataset, mlp, params, trainer, xy

import fleetlite
from fleetlite.checkpoint import CheckpointError, find_newest, load_checkpoint, save_checkpoint
from fleetlite.io import TensorLoader
from fleetlite.trainer.callbacks import ModelCheckpoint

HERE = Path(__file__).resolve().parent


def images(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiny uint8 images (n, 3, 2, 2) and labels, what a TensorLoader takes."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, 2, 2), generator=g, dtype=torch.uint8), torch.randint(0, 3, (n,), generator=g)


# -- 16: compile keeps what it is not given --------------------------------------------------------------------
def test_compile_keeps_the_loss_and_metrics_given_to_the_constructor():
    net = mlp()
    acc = fleetlite.metric.Accuracy()
    t = fleetlite.Trainer(net, loss=nn.CrossEntropyLoss(), metrics=acc, device="cpu")
    t.compile(torch.optim.SGD(net.parameters(), lr=0.1))
    assert isinstance(t.loss_fn, nn.CrossEntropyLoss) and t.metrics == [acc]
    h = t.fit(dataset(32), epochs=1, batch_size=8, verbose=0)
    assert set(h.history) == {"loss", "acc"}
    t.compile(metrics=[])  # an explicit empty list still clears
    assert t.metrics == [] and t.user_optimizer is not None


# -- 3: data that yields no batch ----------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: dict(train_data=dataset(5), batch_size=8, drop_last=True),
    lambda: dict(train_data=TensorLoader(*images(5), batch_size=8, drop_last=True)),
    lambda: dict(train_data=DataLoader(dataset(5), batch_size=8, drop_last=True)),
])
def test_fit_on_data_without_a_single_batch_is_refused_before_training(make):
    t = trainer()
    kw = make()
    with pytest.raises(ValueError, match=r"training data yields no batch.*5 samples.*batch size 8.*drop_last"):
        t.fit(**kw, epochs=1, verbose=0)
    assert t.global_step == 0


def test_evaluation_data_that_drops_its_last_batch_is_refused():
    """Found beyond the issue's list: a plain DataLoader(drop_last=True) as eval_data skipped samples silently."""
    loader = DataLoader(dataset(10), batch_size=3, drop_last=True)
    with pytest.raises(ValueError, match=r"drops the last incomplete batch \(drop_last=True\)"):
        trainer().fit(dataset(8), eval_data=loader, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="drop_last=False for evaluation data"):
        trainer().evaluate(loader, verbose=0)


# -- 7: Keras' fit(x, y), fit(x), evaluate(x, y) ----------------------------------------------------------------
def test_keras_style_fit_x_y_trains_like_fit_on_the_tuple():
    x, y = xy(40)
    a, b = trainer(), trainer()
    a.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    b.fit((x, y), epochs=2, batch_size=8, shuffle=False, verbose=0)
    for k, v in params(b).items():
        assert torch.equal(params(a)[k], v), k
    assert a.evaluate(x, y, verbose=0) == b.evaluate((x, y), verbose=0)


def test_fit_on_inputs_without_labels_says_what_is_missing():
    x, _ = xy(16)
    with pytest.raises(ValueError, match=r"no labels.*fit\(\(x, y\)\)"):
        trainer().fit(x, epochs=1, batch_size=8, verbose=0)


def test_evaluate_with_a_tensor_in_the_wrong_place_is_a_short_error():
    x, y = xy(16)
    with pytest.raises(ValueError, match=r"evaluate\(x, y\) with x of shape \(16, 6\) and y of shape \(3,\)") as info:
        trainer().evaluate(x, torch.zeros(3), verbose=0)
    assert len(str(info.value)) < 400
    with pytest.raises(TypeError, match=r"batch_size must be a positive integer, got a tensor of shape \(3,\)"):
        trainer().evaluate(dataset(16), torch.zeros(3), verbose=0)


# -- 9: ModelCheckpoint with a monitor the logs do not hold ----------------------------------------------------
def test_model_checkpoint_warns_once_when_its_monitor_is_missing(tmp_path):
    x, y = xy(32)
    ck = ModelCheckpoint(str(tmp_path), monitor="val_accuracy")
    with pytest.warns(UserWarning, match=r"val_accuracy.*available.*val_acc") as rec:
        trainer().fit((x, y), eval_data=(x, y), epochs=3, batch_size=8, verbose=0, callbacks=[ck])
    assert len([w for w in rec if "ModelCheckpoint" in str(w.message)]) == 1
    assert not (tmp_path / "best.pt").exists()


# -- 11: resuming a run that already finished ----------------------------------------------------------------
@pytest.mark.parametrize("kind", ["dataset", "tensor_loader"])
def test_resuming_a_finished_run_returns_its_history(tmp_path, kind):
    def data():
        return dataset(40) if kind == "dataset" else TensorLoader(*images(40), batch_size=8, shuffle=True)

    def trainer():
        if kind == "dataset":
            return helpers.trainer()
        torch.manual_seed(0)
        net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
        return fleetlite.Trainer(net, torch.optim.Adam(net.parameters()), nn.CrossEntropyLoss(), device="cpu")

    t = trainer()
    first = t.fit(data(), epochs=2, batch_size=8, verbose=0, save_dir=tmp_path)
    done = params(t)
    files = sorted(os.listdir(tmp_path))
    again = trainer()
    h = again.fit(data(), epochs=2, batch_size=8, verbose=0, save_dir=tmp_path, resume="latest")
    assert h.history == first.history and h.epoch == [0, 1]
    assert again.global_step == t.global_step
    for k, v in done.items():
        assert torch.equal(params(again)[k], v)
    assert sorted(os.listdir(tmp_path)) == files  # nothing rewritten


# -- 5: empty and garbage checkpoint files ---------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"", b"\x00" * 10, b"garbage" * 100, b"PK\x03\x04" + b"\x00" * 60])
def test_empty_or_garbage_file_is_a_checkpoint_error(tmp_path, content):
    p = tmp_path / "bad.pt"
    p.write_bytes(content)
    with pytest.raises(CheckpointError, match=r"bad.pt.*(unreadable|not a fleetlite checkpoint).*older checkpoint"):
        load_checkpoint(p)


def test_resume_latest_falls_back_over_an_empty_latest(tmp_path):
    t = trainer()
    t.fit(dataset(40), epochs=2, batch_size=8, verbose=0, save_dir=tmp_path)
    for resume in ("latest", "auto"):
        (tmp_path / "latest.pt").unlink()
        (tmp_path / "latest.pt").write_bytes(b"")  # e.g. a copy that died at 0 bytes
        (tmp_path / "epoch-0001.pt").write_bytes(b"garbage")
        os.utime(tmp_path / "epoch-0001.pt", (1e10, 1e10))  # the newest file, and broken
        assert find_newest(tmp_path, warn=False) == tmp_path / "epoch-0000.pt"
        r = trainer()
        with pytest.warns(UserWarning, match=r"skipped invalid checkpoint.*latest.pt.*falling back to epoch-0000.pt"):
            h = r.fit(dataset(40), epochs=2, batch_size=8, verbose=0, save_dir=tmp_path, resume=resume)
        assert h.epoch == [0, 1] and r.global_step == t.global_step  # epoch 1 trained again from epoch 0's state
        for k, v in params(t).items():
            assert torch.equal(params(r)[k], v), k
        assert load_checkpoint(tmp_path / "latest.pt")["progress"]["epoch"] == 1


# -- 4: a real write failure (file-size limit) -------------------------------------------------------------
_FSIZE_SCRIPT = r"""
import resource, signal, sys, torch
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG instead of killing us
from fleetlite.checkpoint import CheckpointError, save_checkpoint
d = sys.argv[1]
save_checkpoint({"model": {"w": torch.ones(10)}}, d + "/a.pt", latest=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
try:
    save_checkpoint({"model": {"w": torch.ones(1_000_000)}}, d + "/b.pt", latest=True)
except CheckpointError as e:
    print("CheckpointError:", e)
"""


@pytest.mark.timeout(120)
def test_a_real_file_size_limit_while_saving_is_a_checkpoint_error(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _FSIZE_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CheckpointError:" in proc.stdout and "writing failed" in proc.stdout, proc.stdout
    assert "the previous checkpoint, if any, is unchanged" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "latest.pt"]  # no torn b.pt, no temporary
    assert load_checkpoint(tmp_path / "latest.pt")["model"]["w"].shape == (10,)


# -- 6: another optimizer class than the checkpoint's ----------------------------------------------------------
def test_resume_with_another_optimizer_class_names_both(tmp_path):
    t = trainer()  # Adam
    t.fit(dataset(40), epochs=1, batch_size=8, verbose=0, save_dir=tmp_path)
    net = mlp()
    sgd = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                            device="cpu")
    with pytest.raises(CheckpointError, match=r"optimizer.*Adam.*SGD"):
        sgd.fit(dataset(40), epochs=2, batch_size=8, verbose=0, save_dir=tmp_path, resume="latest")
    assert sgd.global_step == 0
    with pytest.raises(CheckpointError, match=r"optimizer.*Adam.*SGD.*reset_optimizer=True"):
        sgd.load(tmp_path / "latest.pt")
    sgd.load(tmp_path / "latest.pt", reset_optimizer=True)  # weights only: fine


def test_checkpoint_without_optimizer_class_is_checked_by_its_hyperparameters(tmp_path):
    t = trainer()
    t.fit(dataset(40), epochs=1, batch_size=8, verbose=0, save_dir=tmp_path)
    state = load_checkpoint(tmp_path / "latest.pt")
    del state["format"], state["version"]
    state["meta"].pop("optimizer", None)  # as written before the class was recorded
    save_checkpoint(state, tmp_path / "old.pt")
    net = mlp()
    sgd = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                            device="cpu")
    with pytest.raises(CheckpointError, match=r"optimizer.*momentum"):
        sgd.fit(dataset(40), epochs=2, batch_size=8, verbose=0, resume=tmp_path / "old.pt")


# -- 19: a fresh run into the save_dir of an earlier one ---------------------------------------------------------
def test_a_fresh_run_into_an_earlier_runs_save_dir_warns(tmp_path):
    trainer().fit(dataset(24), epochs=1, batch_size=8, verbose=0, save_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"already holds the checkpoints of an earlier run \(epoch-0000.pt, "
                                         r"latest.pt\).*resume='latest'") as rec:
        trainer().fit(dataset(24), epochs=1, batch_size=8, verbose=0, save_dir=tmp_path)
    assert rec[0].filename == __file__  # points at the user's fit call, not inside fleetlite
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer().fit(dataset(24), epochs=1, batch_size=8, verbose=0, save_dir=tmp_path, resume=False)
        trainer().fit(dataset(24), epochs=2, batch_size=8, verbose=0, save_dir=tmp_path, resume="latest")


def test_lr_scheduler_stepped_before_the_optimizer_on_resume_is_silent():
    """The filter for torch's order heuristic is a regex; it must match torch's message."""
    net = mlp()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    cb = fleetlite.trainer.callbacks.LRScheduler(torch.optim.lr_scheduler.StepLR(opt, 1))
    # a run resumed at an epoch end steps the scheduler before its first optimizer step: right, as resumed
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cb.on_epoch_end(0, {})
        torch.optim.lr_scheduler.StepLR(torch.optim.SGD(net.parameters(), lr=0.1), 1).step()  # torch does warn
    assert [str(w.message)[:40] for w in rec] == ["Detected call of `lr_scheduler.step()` b"]


# -- 17: AMP on a CPU device ---------------------------------------------------------------------------------
def test_amp_on_a_cpu_warns_once_with_the_measured_reason():
    from fleetlite.utils import user_warning

    user_warning._SEEN.discard("cpu-amp")
    amp = {"amp": True, "amp_configs": {"dtype": "bfloat16"}}
    with pytest.warns(UserWarning, match=r"strategy.amp is on with a CPU device.*617 ms.*82 ms") as rec:
        trainer(strategy=amp).fit(dataset(16), epochs=1, batch_size=8, verbose=0)
        trainer(strategy=amp).fit(dataset(16), epochs=1, batch_size=8, verbose=0)
    assert len([w for w in rec if "strategy.amp" in str(w.message)]) == 1
    assert rec[0].filename == __file__


def test_no_warning_from_fleetlite_in_a_plain_fit():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer().fit(dataset(24), epochs=1, batch_size=8, verbose=0)
