"""Paddle's callbacks driven by hand on a ``fleetlite.Model``, as Paddle's ``test/legacy_test/test_callbacks.py``
drives them: each callback gets ``set_model(model)`` and ``set_params(...)``, then every hook in turn (training
batches, evaluation, prediction). The expectations are Paddle's, from ``python/paddle/hapi/callbacks.py``:
``ModelCheckpoint`` saves ``{save_dir}/{epoch}`` when ``epoch % save_freq == 0`` and ``{save_dir}/final`` with
``self.model.save``; ``EarlyStopping`` and ``ReduceLROnPlateau`` follow the rules transcribed below."""

import math
import random

import numpy as np
import pytest
import torch
from test_model import MyModel

import fleetlite
from fleetlite import callbacks as C

EPOCHS, STEPS, EVAL_STEPS, LOG_FREQ = 2, 5, 2, 2


def _prepared_model(lr=0.1):
    torch.manual_seed(0)
    net = MyModel()
    model = fleetlite.Model(net)
    model.prepare(torch.optim.SGD(net.parameters(), lr=lr), torch.nn.CrossEntropyLoss())
    return model, net


def _drive(cbks, epochs=EPOCHS):
    """Paddle's ``run_callback``: every hook in turn, with Paddle's logs."""
    for k in cbks:
        k.on_train_begin({})
    logs = {"loss": 50.341673, "acc": 0.00256}
    for epoch in range(epochs):
        for k in cbks:
            k.on_epoch_begin(epoch)
        for step in range(STEPS):
            for k in cbks:
                k.on_train_batch_begin(step, logs)
            logs["loss"] -= random.random() * 0.1
            logs["acc"] += random.random() * 0.1
            logs["batch_size"] = 2
            for k in cbks:
                k.on_train_batch_end(step, logs)
        for k in cbks:
            k.on_epoch_end(epoch, logs)
        eval_logs = {"eval_loss": 20.341673, "eval_acc": 0.256}
        for k in cbks:
            k.on_eval_begin({"steps": EVAL_STEPS, "metrics": ["eval_loss", "eval_acc"]})
        for step in range(EVAL_STEPS):
            for k in cbks:
                k.on_eval_batch_begin(step, eval_logs)
            eval_logs["batch_size"] = 2
            for k in cbks:
                k.on_eval_batch_end(step, eval_logs)
        for k in cbks:
            k.on_eval_end(eval_logs)
        for k in cbks:
            k.on_predict_begin({"steps": EVAL_STEPS})
        for step in range(EVAL_STEPS):
            for k in cbks:
                k.on_predict_batch_begin(step, {})
                k.on_predict_batch_end(step, {"batch_size": 2})
        for k in cbks:
            k.on_predict_end({})
    for k in cbks:
        k.on_train_end(logs)


@pytest.mark.parametrize("verbose", [0, 1, 2, 3])
def test_progbar_and_checkpoint_driven_by_hand_after_set_model(tmp_path, capsys, verbose):
    model, net = _prepared_model()
    cbks = [C.ProgBarLogger(LOG_FREQ, verbose=verbose), C.ModelCheckpoint(1, str(tmp_path))]
    for k in cbks:
        k.set_model(model)
        k.set_params({"batch_size": 128, "epochs": EPOCHS, "steps": STEPS, "verbose": verbose,
                      "metrics": ["loss", "acc"], "log_freq": LOG_FREQ})
    _drive(cbks)
    assert cbks[0].model is model  # Paddle: a callback's model is the Model it was given
    # Paddle's ModelCheckpoint: epoch % save_freq == 0 -> {save_dir}/{epoch}, then {save_dir}/final
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert saved == ["0.pdopt", "0.pdparams", "1.pdopt", "1.pdparams", "final.pdopt", "final.pdparams"]
    weights = torch.load(tmp_path / "final.pdparams", weights_only=True)
    assert weights.keys() == net.state_dict().keys()
    for name, value in net.state_dict().items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0)
    assert ("Epoch 1/2" in capsys.readouterr().out) == bool(verbose)


def _paddle_early_stopping(values, mode, patience, min_delta=0.0, baseline=None):
    """Paddle's ``EarlyStopping.on_eval_end`` rule: the evaluation after which ``stop_training`` is set (or None)."""
    less = mode == "min"
    delta = -abs(min_delta) if less else abs(min_delta)
    best = baseline if baseline is not None else (math.inf if less else -math.inf)
    wait = 0
    for i, current in enumerate(values):
        improved = (current - delta < best) if less else (current - delta > best)
        if improved:
            best, wait = current, 0
        else:
            wait += 1
        if wait >= patience:
            return i
    return None


@pytest.mark.parametrize("mode, values, patience", [
    ("min", [1.0, 0.5, 0.6, 0.4, 0.45, 0.46], 2),
    ("min", [1.0, 0.9, 0.8], 1),
    ("max", [0.1, 0.3, 0.2, 0.25], 2),
])
def test_early_stopping_driven_through_on_eval_end(tmp_path, mode, values, patience):
    model, _ = _prepared_model()
    monitor = "acc" if mode == "max" else "loss"
    stop = C.EarlyStopping(monitor, mode=mode, patience=patience, verbose=0, save_best_model=True)
    stop.save_dir = str(tmp_path)  # as Paddle's config_callbacks sets it
    stop.set_model(model)
    stop.on_train_begin({})
    expected = _paddle_early_stopping(values, mode, patience)
    stopped_at = None
    for i, v in enumerate(values):
        stop.on_eval_begin({})
        stop.on_eval_end({monitor: [v], "batch_size": 2})  # Paddle's evaluate logs: the loss as a list
        if model.stop_training and stopped_at is None:
            stopped_at = i
    assert stopped_at == expected
    assert (tmp_path / "best_model.pdparams").is_file()


def _paddle_reduce_lr(values, lr, factor, patience, min_delta, cooldown, min_lr):
    """Paddle's ``ReduceLROnPlateau.on_eval_end`` rule (mode 'min'): the learning rate after each evaluation."""
    best, wait, cooldown_counter, out = np.inf, 0, 0, []
    for current in values:
        if cooldown_counter > 0:
            cooldown_counter -= 1
            wait = 0
        if current < best - min_delta:
            best, wait = current, 0
        elif not cooldown_counter > 0:
            wait += 1
            if wait >= patience and lr > np.float32(min_lr):
                lr = max(lr * factor, min_lr)
                cooldown_counter, wait = cooldown, 0
        out.append(lr)
    return out


@pytest.mark.parametrize("cooldown", [0, 1])
def test_reduce_lr_on_plateau_driven_through_on_eval_end(cooldown):
    model, _ = _prepared_model(lr=0.1)
    values = [1.0, 0.9, 0.95, 0.97, 0.99, 0.98, 0.5, 0.6, 0.7, 0.8]
    cb = C.ReduceLROnPlateau("loss", factor=0.5, patience=2, verbose=0, min_delta=1e-4, cooldown=cooldown,
                             min_lr=0.02)
    cb.set_model(model)
    cb.on_train_begin({})
    lrs = []
    for v in values:
        cb.on_eval_end({"loss": [v]})
        lrs.append(model._optimizer.param_groups[0]["lr"])
    expected = _paddle_reduce_lr(values, 0.1, 0.5, 2, 1e-4, cooldown, 0.02)
    assert any(a != b for a, b in zip(expected, expected[1:]))  # the case does lower the rate
    np.testing.assert_allclose(lrs, expected, rtol=1e-12, equal_nan=False)


def test_standalone_evaluation_is_not_an_epoch_of_fit():
    """Without ``on_train_begin`` (a standalone ``evaluate``) neither acts, and after ``on_train_end`` neither
    does: Paddle's callbacks act on the evaluations of a training run (fleetlite's documented rule)."""
    model, _ = _prepared_model(lr=0.1)
    stop = C.EarlyStopping("loss", patience=0, verbose=0)
    plateau = C.ReduceLROnPlateau("loss", factor=0.5, patience=1, verbose=0)
    for k in (stop, plateau):
        k.set_model(model)
    for v in (1.0, 2.0, 3.0):
        stop.on_eval_end({"loss": [v]})
        plateau.on_eval_end({"loss": [v]})
    assert model.stop_training is False and model._optimizer.param_groups[0]["lr"] == 0.1
