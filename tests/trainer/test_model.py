"""fleetlite.Model as Paddle's test_model.py calls paddle.Model: positional order, defaults, batch methods and
their return layouts, save/load prefixes, fit schedules (eval_freq, save_dir/save_freq, per-batch LR scheduler),
evaluate/predict layouts, amp_configs validation, summary and flops."""

import os

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import fleetlite
from fleetlite.callbacks import Callback, LRScheduler
from fleetlite.metric import Accuracy


class MyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._fc = torch.nn.Linear(20, 10)

    def forward(self, x):
        return self._fc(x)


class MyDataset(Dataset):
    def __init__(self, n=40, seed=0):
        g = np.random.default_rng(seed)
        self.x = g.random((n, 20)).astype(np.float32)
        self.y = g.integers(0, 10, (n, 1)).astype(np.int64)

    def __getitem__(self, idx):
        return self.x[idx], self.y[idx]

    def __len__(self):
        return len(self.x)


class CrossEntropyLoss(torch.nn.Module):  # Paddle's: labels (N, 1)
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(x, y.reshape(-1), reduction=self.reduction)


def _model(seed=1024, metrics=None, lr=0.001):
    torch.manual_seed(seed)
    net = MyModel()
    model = fleetlite.Model(net)
    model.prepare(torch.optim.SGD(net.parameters(), lr=lr), CrossEntropyLoss(reduction="sum"), metrics)
    return model, net


def test_train_batch_matches_hand_step():
    rng = np.random.default_rng(0)
    data, label = rng.random((4, 20)).astype(np.float32), rng.integers(0, 10, (4, 1))
    torch.manual_seed(1024)
    ref = MyModel()
    opt = torch.optim.SGD(ref.parameters(), lr=0.001)
    loss = CrossEntropyLoss("sum")(ref(torch.tensor(data)), torch.tensor(label))
    loss.backward()
    opt.step()
    model, net = _model()
    (out,) = model.train_batch([data], [label])
    np.testing.assert_allclose(out.flatten(), loss.detach().numpy().flatten(), rtol=1e-6, equal_nan=False)
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)
    losses, metrics = _model(metrics=Accuracy())[0].train_batch([data], [label])
    assert isinstance(losses[0], np.ndarray) and isinstance(metrics[0], float)


def test_train_batch_accumulates_gradients_like_paddle():
    rng = np.random.default_rng(1)
    data, label = rng.random((4, 20)).astype(np.float32), rng.integers(0, 10, (4, 1))
    model, net = _model()
    losses, grads = [], []
    for update in (False, False, True):
        (loss,) = model.train_batch([data], [label], update=update)
        losses.append(loss)
        grads.append([p.grad.clone().numpy() for p in net.parameters()])
    for g1, g2, g3 in zip(*grads):
        np.testing.assert_allclose(g1 * 2, g2, rtol=1e-5, equal_nan=False)
        np.testing.assert_allclose(g3, np.zeros_like(g3), rtol=0, atol=0, equal_nan=False)  # cleared, as Paddle
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6, equal_nan=False)


def test_eval_and_predict_batch():
    rng = np.random.default_rng(2)
    data, label = rng.random((4, 20)).astype(np.float32), rng.integers(0, 10, (4, 1))
    model, net = _model(metrics=Accuracy(topk=(1, 2)))
    (out,) = model.predict_batch([data])
    np.testing.assert_allclose(out, net(torch.tensor(data)).detach().numpy(), rtol=1e-6, equal_nan=False)
    assert model.predict_batch(data)[0].shape == (4, 10)  # a bare array is one input
    losses, metrics = model.eval_batch([data], [label])
    assert len(losses) == 1 and isinstance(metrics[0], list) and len(metrics[0]) == 2
    params = model.parameters()
    assert isinstance(params, list) and tuple(params[0].shape) == (10, 20)


def test_save_load_prefixes(tmp_path):
    model, net = _model()
    model.fit(MyDataset(), batch_size=8, verbose=0)
    path = tmp_path / "ckpt"
    path.mkdir()  # a directory of that name: the path stays a file prefix
    model.save(str(path))
    assert (tmp_path / "ckpt.pdparams").is_file() and (tmp_path / "ckpt.pdopt").is_file()
    model2, net2 = _model(seed=7)
    model2.load(str(path))
    for a, b in zip(net.state_dict().values(), net2.state_dict().values()):
        assert torch.equal(a, b)
    model2.load(str(tmp_path / "ckpt.pdparams"), reset_optimizer=True)  # a postfix is stripped
    other = fleetlite.Model(torch.nn.Sequential(torch.nn.Linear(20, 3)))
    with pytest.raises(ValueError, match="not found in the providing file"):
        other.load(str(path))
    with pytest.warns(UserWarning, match="Skip loading"):
        other.load(str(path), skip_mismatch=True)
    with pytest.raises(ValueError, match="no parameter file"):
        model.load(str(tmp_path / "missing"))


def test_save_for_inference_needs_a_run_or_inputs(tmp_path):
    with pytest.raises(RuntimeError, match="input shapes"):
        fleetlite.Model(MyModel()).save(str(tmp_path / "infer"), training=False)
    model, _ = _model()
    model.predict_batch([np.zeros((1, 20), np.float32)])
    with pytest.raises(ValueError, match="file_prefix"):
        model.save("", training=False)
    model.save(str(tmp_path / "infer"), training=False)
    assert any(p.name.startswith("infer") for p in tmp_path.iterdir())


class Events(Callback):
    def __init__(self):
        super().__init__()
        self.events = []

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch", epoch))

    def on_eval_end(self, logs=None):
        self.events.append(("eval", self.trainer.epoch))


def test_fit_paddle_schedules(tmp_path):
    model, net = _model(metrics=Accuracy())
    ev = Events()
    opt = model._optimizer
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model.fit(MyDataset(), MyDataset(11, 1), (8, 4), 4, 3, save_dir=str(tmp_path), save_freq=2, verbose=0,
              callbacks=ev)  # positional: batch_size=(train, eval), epochs=4, eval_freq=3; one callback
    assert [e[1] for e in ev.events if e[0] == "eval"] == [0, 3]  # after epochs with epoch % eval_freq == 0
    assert sorted(os.listdir(tmp_path)) == ["0.pdopt", "0.pdparams", "2.pdopt", "2.pdparams", "final.pdopt",
                                            "final.pdparams"]
    assert sched.last_epoch == 4 * 5  # stepped per batch (Paddle adds LRScheduler(by_step=True))
    model2, _ = _model()
    sched2 = torch.optim.lr_scheduler.StepLR(model2._optimizer, step_size=1, gamma=0.5)
    model2.fit(MyDataset(), batch_size=8, epochs=3, verbose=0, callbacks=LRScheduler(False, True))
    assert sched2.last_epoch == 3  # LRScheduler(by_step=False, by_epoch=True), positional as in Paddle


def test_evaluate_and_predict_layouts():
    model, net = _model(metrics=Accuracy())
    ds = MyDataset(37, 3)
    res = model.evaluate(ds, batch_size=8, verbose=0)
    assert list(res) == ["loss", "acc"] and isinstance(res["loss"], list) and len(res["loss"]) == 1
    ref = fleetlite.Trainer(net, None, CrossEntropyLoss("sum"), metrics=Accuracy(), device="cpu")
    assert res["acc"] == ref.evaluate(ds, batch_size=8, verbose=0)["acc"]
    part = model.evaluate(ds, batch_size=8, verbose=0, num_iters=2)
    with torch.no_grad():
        pred = net(torch.tensor(ds.x[:16])).argmax(1).numpy()
    assert part["acc"] == float((pred == ds.y[:16, 0]).mean())
    out = model.predict(ds, batch_size=8, stack_outputs=True, verbose=0)
    assert isinstance(out, list) and len(out) == 1 and out[0].shape == (37, 10)
    np.testing.assert_allclose(out[0], net(torch.tensor(ds.x)).detach().numpy(), rtol=1e-5, atol=1e-6, equal_nan=False)
    out = model.predict(ds, batch_size=8, verbose=0)
    assert len(out) == 1 and [b.shape[0] for b in out[0]] == [8, 8, 8, 8, 5]


def test_prepare_validates_like_paddle():
    model = fleetlite.Model(MyModel())
    with pytest.raises(ValueError, match="'O0', 'O1' or 'O2'"):
        model.prepare(amp_configs="O3")
    with pytest.raises(ValueError, match="could not be recognized"):
        model.prepare(amp_configs={"level": "O1", "bad_key": 1})
    with pytest.raises(ValueError, match="should be 'O0', 'O1' or 'O2'"):
        model.prepare(amp_configs={"level": "O4"})
    with pytest.raises(TypeError):
        model.prepare(loss=3)
    with pytest.raises(AssertionError):
        model.prepare(metrics=object())
    with pytest.warns(UserWarning, match="CUDA"):
        model.prepare(amp_configs="O1")  # no GPU here: float32, as Paddle without one


def test_positional_mistakes_are_caught():
    model, _ = _model()
    with pytest.raises(TypeError, match="is a number, not data"):
        model.fit(MyDataset(), 10)
    with pytest.warns(UserWarning, match="did you mean epochs=64"):
        model.fit(MyDataset(), None, 64, verbose=0)
    t = fleetlite.Trainer(MyModel(), None, CrossEntropyLoss(), device="cpu")
    with pytest.raises(TypeError, match="epochs, batch_size"):
        t.fit(MyDataset(), 64)


def test_input_specs_need_names(tmp_path):
    from fleetlite.static import InputSpec

    with pytest.raises(ValueError, match="needs a name"):
        fleetlite.Model(MyModel(), [InputSpec([None, 10], "float32")])
    model = fleetlite.Model(MyModel(), [InputSpec([None, 20], "float32", "x")],
                            [InputSpec([None, 1], "int64", "label")])
    assert model.summary()["total_params"] == 210
    model.save(str(tmp_path / "infer"), training=False)  # specs given: no run needed
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.01), CrossEntropyLoss(), Accuracy())
    model.fit(MyDataset(), MyDataset(8, 1), batch_size=8, verbose=0)  # 1 input spec: (x, label) split
    with pytest.raises(ValueError):
        InputSpec([None, 0])


def test_summary_and_flops_numbers(capsys):
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    info = fleetlite.summary(net, (-1, 3, 8, 8))
    assert info == {"total_params": 258, "trainable_params": 258}
    assert "[1, 8, 6, 6]" in capsys.readouterr().out
    # conv 6*6*8*(3*9+1) + bn 2*288 + adaptive pool (36+1)*8 + linear 8*2
    assert fleetlite.flops(net, [1, 3, 8, 8]) == 8064 + 576 + 296 + 16

    def no_dropout(m, x, y):
        m.total_ops += 5

    assert fleetlite.flops(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Dropout()), [1, 4],
                           custom_ops={torch.nn.Dropout: no_dropout}) == 8 + 5
    with pytest.raises(TypeError):
        fleetlite.summary(torch.nn.GRU(2, 3, 3), (1, 1, "2"))
    with pytest.raises(ValueError):
        fleetlite.summary(torch.nn.GRU(2, 3, 3), (-1, -1))
    assert fleetlite.summary(torch.nn.Embedding(10, 3), (3, 1), dtypes="int64")["total_params"] == 30


def test_seed_everything_reproduces(monkeypatch):
    import random

    fleetlite.seed_everything(5)
    a = (random.random(), np.random.rand(), torch.rand(2))
    fleetlite.seed_everything(5)
    b = (random.random(), np.random.rand(), torch.rand(2))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda flag: None)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    fleetlite.seed_everything(5, deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    with pytest.raises(ValueError):
        fleetlite.seed_everything(-1)


def _model_two_ranks(rank=0, world=1):
    torch.set_num_threads(1)
    model, net = _model(lr=0.01)
    model.prepare(model._optimizer, CrossEntropyLoss("mean"), Accuracy())  # ranks average gradients
    model.fit(MyDataset(40), batch_size=8 // world, epochs=1, shuffle=False, verbose=0)
    res = model.evaluate(MyDataset(37, 3), batch_size=4, verbose=0)
    out = model.predict(MyDataset(37, 3), batch_size=4, stack_outputs=True, verbose=0)
    return res, out[0], {k: v.clone() for k, v in net.state_dict().items()}


def test_model_on_two_ranks_equals_one_process():
    from fleetlite.testing import run_ranks

    ref_res, ref_out, ref_w = _model_two_ranks()
    for res, out, w in run_ranks(_model_two_ranks, world_size=2, timeout=240):
        assert res["acc"] == ref_res["acc"] and res["loss"][0] == pytest.approx(ref_res["loss"][0], rel=1e-5)
        assert out.shape == (37, 10)  # every sample once, in dataset order
        np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=1e-5, equal_nan=False)
        for k in ref_w:
            torch.testing.assert_close(w[k], ref_w[k], rtol=1e-5, atol=1e-6)


def test_paddle_module_paths():
    from fleetlite.hapi.callbacks import config_callbacks
    from fleetlite.hapi.model import Model, prepare_distributed_context, to_list

    assert Model is fleetlite.Model and fleetlite.hapi.Model is fleetlite.Model and callable(config_callbacks)
    assert to_list(None) is None and to_list((1, 2)) == [1, 2] and to_list(3) == [3]
    assert prepare_distributed_context().nranks == 1
