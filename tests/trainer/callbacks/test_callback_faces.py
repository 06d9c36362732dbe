"""Each face in its own classes. ``fleetlite.Model`` is composed over a Trainer (no subclass, no
mode flag); Paddle's callbacks (``fleetlite.callbacks``) and Keras' (``fleetlite.trainer.callbacks``) each keep
their own signatures and behaviour, and either kind works under either face: the class decides."""

import inspect
import os

import pytest
import torch
from test_model import CrossEntropyLoss, MyDataset, MyModel, _model
from trainer_helpers import dataset, trainer

import fleetlite
import fleetlite.hapi.callbacks as H
from fleetlite import callbacks as P
from fleetlite.trainer import callbacks as K

# Paddle's python/paddle/hapi/callbacks.py signatures: (name, default) in positional order
PADDLE_SIGNATURES = {
    "ModelCheckpoint": [("save_freq", 1), ("save_dir", None)],
    "LRScheduler": [("by_step", True), ("by_epoch", False)],
    "EarlyStopping": [("monitor", "loss"), ("mode", "auto"), ("patience", 0), ("verbose", 1), ("min_delta", 0),
                      ("baseline", None), ("save_best_model", True)],
    "ReduceLROnPlateau": [("monitor", "loss"), ("factor", 0.1), ("patience", 10), ("verbose", 1), ("mode", "auto"),
                          ("min_delta", 1e-4), ("cooldown", 0), ("min_lr", 0)],
    "ProgBarLogger": [("log_freq", 1), ("verbose", 2)],
}
# Keras 3's keras/src/callbacks signatures (the Keras-named classes of the Trainer's namespace)
KERAS_SIGNATURES = {
    "EarlyStopping": [("monitor", "val_loss"), ("min_delta", 0), ("patience", 0), ("verbose", 0), ("mode", "auto"),
                      ("baseline", None), ("restore_best_weights", False), ("start_from_epoch", 0)],
    "ReduceLROnPlateau": [("monitor", "val_loss"), ("factor", 0.1), ("patience", 10), ("verbose", 0),
                          ("mode", "auto"), ("min_delta", 1e-4), ("cooldown", 0), ("min_lr", 0.0)],
}


def _signature(cls):
    return [(p.name, p.default) for p in inspect.signature(cls).parameters.values()]


def test_paddle_and_keras_signatures_and_namespaces():
    for name, sig in PADDLE_SIGNATURES.items():
        assert _signature(getattr(P, name)) == sig, name
        assert getattr(H, name) is getattr(P, name)
    for name, sig in KERAS_SIGNATURES.items():
        assert _signature(getattr(K, name)) == sig, name
    differ = sorted(n for n in K.__all__ if getattr(P, n) is not getattr(K, n))
    assert differ == ["EarlyStopping", "LRScheduler", "ModelCheckpoint", "ReduceLROnPlateau"]
    assert set(K.__all__) <= set(P.__all__) and "config_callbacks" in H.__all__
    with pytest.raises(TypeError, match="fleetlite.trainer.callbacks.ModelCheckpoint"):
        P.ModelCheckpoint("runs/ckpt")  # Trainer habits get a pointer to the Trainer's class
    with pytest.raises(TypeError, match="fleetlite.trainer.callbacks.LRScheduler"):
        P.LRScheduler(torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1)], 0.1), 1))
    with pytest.raises(TypeError, match="fleetlite.callbacks.ModelCheckpoint"):
        K.ModelCheckpoint(1, "ckpt")  # Paddle's positional order on the Trainer's class
    with pytest.raises(ValueError, match="mutually exclusive"):
        P.LRScheduler(True, True)


def test_model_is_composed_not_a_trainer():
    model = fleetlite.Model(MyModel())
    assert not isinstance(model, fleetlite.Trainer) and isinstance(model.trainer, fleetlite.Trainer)
    assert not hasattr(model, "compile") and not hasattr(model, "global_step")  # Paddle's API only
    # no mode flag: neither the Trainer nor the Model's Trainer carries one
    assert not any("paddle_hapi" in vars(c) for c in type(model.trainer).__mro__ if c is not fleetlite.Trainer)


class Evals(K.Callback):
    def __init__(self):
        super().__init__()
        self.n = 0

    def on_eval_end(self, logs=None):
        self.n += 1


def test_paddle_early_stopping_acts_on_evaluations_under_the_trainer():
    # the same rule under both faces: improve, wait 1, wait 2 -> stop after 3 evaluations (Paddle's rule)
    for face in ("model", "trainer"):
        ev = Evals()
        if face == "model":
            m, _ = _model(lr=0.0)
            m.fit(MyDataset(), MyDataset(8, 1), batch_size=8, epochs=10, verbose=0,
                  callbacks=[P.EarlyStopping(patience=2, verbose=0), ev])
        else:
            t = trainer(lr=0.0)
            t.fit(dataset(16), eval_data=dataset(8, 2), epochs=10, batch_size=8, verbose=0,
                  callbacks=[P.EarlyStopping(patience=2, verbose=0), ev])
        assert ev.n == 3, face


def test_keras_early_stopping_acts_on_epoch_logs_under_the_model():
    stop = K.EarlyStopping(monitor="val_loss", patience=1)
    m, _ = _model(lr=0.0)
    hist = m.fit(MyDataset(), MyDataset(8, 1), batch_size=8, epochs=10, verbose=0, callbacks=[stop])
    assert hist.epoch == [0, 1] and stop.stopped_epoch == 1  # Keras: no improvement at epoch 1, patience 1


def test_checkpoints_follow_their_class_not_the_face(tmp_path):
    t = trainer()
    t.fit(dataset(16), epochs=2, batch_size=8, verbose=0, callbacks=[P.ModelCheckpoint(1, str(tmp_path / "p"))])
    assert sorted(os.listdir(tmp_path / "p")) == ["0.pdopt", "0.pdparams", "1.pdopt", "1.pdparams", "final.pdopt",
                                                  "final.pdparams"]
    m, net = _model()
    m.fit(MyDataset(), batch_size=8, epochs=2, verbose=0, callbacks=[K.ModelCheckpoint(str(tmp_path / "k"))])
    assert {"epoch-0000.pt", "epoch-0001.pt", "latest.pt"} <= set(os.listdir(tmp_path / "k"))
    m2, net2 = _model(seed=3)
    m2.load(str(tmp_path / "k" / "latest.pt"))  # a Trainer checkpoint loads into the Model
    for a, b in zip(net.parameters(), net2.parameters()):
        torch.testing.assert_close(a, b)


def test_paddle_lr_scheduler_and_progbar_under_the_trainer(capsys):
    t = trainer(lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(t.user_optimizer, step_size=1, gamma=0.5)
    t.fit(dataset(16), epochs=2, batch_size=4, accumulate_grad_batches=2, verbose=0,
          callbacks=[P.LRScheduler(), P.ProgBarLogger(log_freq=100)])
    assert sched.last_epoch == 2 * 4  # Paddle's class: every batch, whichever face
    out = capsys.readouterr().out
    assert "Epoch 1/2" in out and "Epoch 2/2" in out  # Paddle's label (from 1) under the Trainer too


def test_config_callbacks_accepts_the_trainer(tmp_path):
    t = trainer()
    cbks = H.config_callbacks(model=t, epochs=1, steps=1, verbose=0, save_dir=str(tmp_path))
    cbks.on_begin("train")
    cbks.on_epoch_begin(0)
    cbks.on_epoch_end(0, {"loss": 1.0})
    cbks.on_end("train")
    assert sorted(os.listdir(tmp_path)) == ["0.pdopt", "0.pdparams", "final.pdopt", "final.pdparams"]


def test_paddle_loss_sum_under_model_prepare_replaces_all():
    m, net = _model()
    m.prepare(torch.optim.SGD(net.parameters(), 0.1), CrossEntropyLoss())
    m.prepare()  # Paddle: each call replaces all four
    assert m._optimizer is None and m._loss is None and m._metrics == []


def test_paddle_monitor_with_keras_name_says_what_to_do():
    t = trainer()
    with pytest.warns(UserWarning, match="without the val_ prefix \\(monitor='loss'\\)"):
        t.fit(dataset(16), eval_data=dataset(8, 2), epochs=1, batch_size=8, verbose=0,
              callbacks=[P.EarlyStopping(monitor="val_loss")])


def test_reduce_lr_on_plateau_follows_its_class():
    # Paddle's class under the Trainer: evaluations 0..6 on the evaluation 'loss', reduced at 2, 4, 6
    t = trainer(lr=1e-12)
    t.fit(dataset(16), eval_data=dataset(8, 2), epochs=7, batch_size=8, verbose=0,
          callbacks=[P.ReduceLROnPlateau(patience=2, factor=0.5, verbose=0)])
    assert t.user_optimizer.param_groups[0]["lr"] == pytest.approx(1e-12 * 0.5 ** 3)
    # Keras' class under the Model: epoch logs ('val_loss'), patience 1: reduced at epochs 1 and 2
    m, _ = _model(lr=1e-12)
    m.fit(MyDataset(), MyDataset(8, 1), batch_size=8, epochs=3, verbose=0,
          callbacks=[K.ReduceLROnPlateau("val_loss", factor=0.5, patience=1)])
    assert m._optimizer.param_groups[0]["lr"] == pytest.approx(1e-12 * 0.5 ** 2)


class SaveEachEpoch(K.Callback):
    """Paddle's documented custom-callback pattern: ``self.model.save('{dir}/{epoch}')``."""

    def __init__(self, save_dir):
        super().__init__()
        self.save_dir = save_dir

    def on_epoch_end(self, epoch, logs=None):
        self.model.save(f"{self.save_dir}/{epoch}")


def test_custom_paddle_callback_saves_paddle_files_under_the_model(tmp_path):
    m, _ = _model()
    m.fit(MyDataset(), batch_size=8, epochs=2, verbose=0, callbacks=[SaveEachEpoch(str(tmp_path))])
    assert sorted(os.listdir(tmp_path)) == ["0.pdopt", "0.pdparams", "1.pdopt", "1.pdparams"]
    m.load(str(tmp_path / "1"))
