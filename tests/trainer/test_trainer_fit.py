"""fit/evaluate/predict in one process: learning, equality with a hand-written torch loop (plain, accumulated,
gradient merge), data kinds, save/load, summary, and the errors raised before any work."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader
from trainer_helpers import dataset, mlp, params, trainer, xy

import fleetlite
from fleetlite.checkpoint import CheckpointError
from fleetlite.io import DistributedBatchSampler


def _hand_loop(n, batch_size, epochs, accumulate=1, lr=0.2):
    net = mlp(0)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    x, y = xy(n)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        batches = list(zip(x.split(batch_size), y.split(batch_size)))
        for i, (xb, yb) in enumerate(batches):
            (loss_fn(net(xb), yb) / accumulate).backward()
            if (i + 1) % accumulate == 0 or i == len(batches) - 1:
                opt.step()
                opt.zero_grad()
    return net.state_dict()


def _sgd_trainer(**kw):
    t = trainer(**kw)
    t.compile(torch.optim.SGD(t.network.parameters(), lr=0.2, momentum=0.9), nn.CrossEntropyLoss())
    return t


@pytest.mark.parametrize("accumulate,via_strategy", [(1, False), (3, False), (3, True)])
def test_fit_equals_hand_written_loop(accumulate, via_strategy):
    ref = _hand_loop(43, 8, 2, accumulate)
    if via_strategy:  # Paddle's gradient merge is the same accumulation
        strategy = {"gradient_merge": True, "gradient_merge_configs": {"k_steps": accumulate, "avg": True}}
        t = _sgd_trainer(strategy=strategy)
        t.fit(dataset(43), epochs=2, batch_size=8, shuffle=False, verbose=0)
    else:
        t = _sgd_trainer()
        t.fit(dataset(43), epochs=2, batch_size=8, shuffle=False, accumulate_grad_batches=accumulate, verbose=0)
    got = params(t)
    for k in ref:
        assert torch.equal(got[k], ref[k]), k
    assert t.global_step == 2 * (-(-6 // accumulate))


def test_data_kinds_give_the_same_training():
    x, y = xy(30)
    ds = dataset(30)
    runs = {
        "dataset": ds,
        "tensors": (x, y),
        "loader": DataLoader(ds, batch_sampler=DistributedBatchSampler(ds, 8, num_replicas=1, rank=0)),
        "plain_loader": DataLoader(ds, batch_size=8),
    }
    results = {}
    for name, data in runs.items():
        t = _sgd_trainer()
        t.fit(data, epochs=2, batch_size=8, shuffle=False, verbose=0)
        results[name] = params(t)
    for name, p in results.items():
        for k in p:
            assert torch.equal(p[k], results["dataset"][k]), (name, k)


def test_num_iters_and_history():
    t = trainer()
    hist = t.fit(dataset(40), epochs=5, batch_size=8, num_iters=7, verbose=0)
    assert t.global_step == 7 and hist.epoch == [0]  # epoch 1 stopped mid-way: no epoch end for it


def test_learns_synthetic_cifar10_with_a_small_cnn():
    from fleetlite.io import TensorLoader
    from fleetlite.vision.datasets import SyntheticCifar10

    xtr, ytr = SyntheticCifar10(mode="train", size=1024).as_tensors()
    xte, yte = SyntheticCifar10(mode="test", size=500).as_tensors()
    torch.manual_seed(0)

    def block(i, o):
        return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2)]

    net = nn.Sequential(*block(3, 16), *block(16, 32), *block(32, 32), nn.AdaptiveMaxPool2d(1), nn.Flatten(),
                        nn.Linear(32, 10))
    t = fleetlite.Trainer(net, torch.optim.Adam(net.parameters(), 3e-3), nn.CrossEntropyLoss(),
                          metrics=fleetlite.metric.Accuracy(), device="cpu")
    train = TensorLoader(xtr, ytr, 32, augment=False, num_replicas=1, rank=0)
    test = TensorLoader(xte, yte, 250, shuffle=False, augment=False, num_replicas=1, rank=0)
    hist = t.fit(train, eval_data=test, epochs=3, verbose=0)
    assert hist.history["val_acc"][-1] > 0.3  # chance is 0.1
    assert hist.history["loss"][-1] < hist.history["loss"][0]


def test_save_load_roundtrip_and_mismatch(tmp_path):
    t = trainer()
    t.fit(dataset(16), epochs=1, batch_size=8, verbose=0)
    t.save(tmp_path / "full")  # ".pt" added
    t.save(tmp_path / "weights.pt", training=False)
    torch.save(t.network.state_dict(), tmp_path / "plain.pt")
    for name in ("full", "weights.pt", "plain.pt"):
        u = trainer(seed=5)
        u.load(tmp_path / name)
        for k, v in params(t).items():
            assert torch.equal(params(u)[k], v), (name, k)
    u = trainer(seed=5)
    u.loss_fn = None  # loading needs no loss
    u.load(tmp_path / "full.pt")
    assert u.optimizer.state_dict()["state"][0]["step"] == t.optimizer.state_dict()["state"][0]["step"]
    other = fleetlite.Trainer(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0), nn.Linear(16, 4)),
                              device="cpu")
    with pytest.raises(CheckpointError, match="skip_mismatch=True"):
        other.load(tmp_path / "full.pt")
    with pytest.warns(UserWarning, match="skipped 2 mismatched"):
        other.load(tmp_path / "full.pt", skip_mismatch=True, reset_optimizer=True)
    assert torch.equal(other.network[0].weight, t.network[0].weight)


def test_summary_counts_parameters_per_layer(capsys):
    t = trainer()
    info = t.summary()
    assert info["total_params"] == sum(p.numel() for p in t.network.parameters()) == 6 * 16 + 16 + 16 * 3 + 3
    assert [(r["name"], r["params"]) for r in info["layers"]] == [("0", 112), ("3", 51)]
    assert "Linear" in capsys.readouterr().out


def test_custom_steps_override():
    class Doubled(fleetlite.Trainer):
        def predict_step(self, batch):
            return self.network(batch[0]) * 2

    t = Doubled(mlp(), device="cpu")
    out = t.predict(dataset(5), stack_outputs=True)
    torch.testing.assert_close(out, mlp()(xy(5)[0]).detach() * 2)


def test_errors_before_work():
    with pytest.raises(ValueError, match="needs an optimizer"):
        fleetlite.Trainer(mlp(), device="cpu").fit(dataset(4), verbose=0)
    with pytest.raises(ValueError, match="needs a loss"):
        fleetlite.Trainer(mlp(), torch.optim.SGD(mlp().parameters(), 0.1), device="cpu").fit(dataset(4), verbose=0)
    with pytest.raises(ValueError, match="epochs=0 must be a positive integer"):
        trainer().fit(dataset(4), epochs=0)
    with pytest.raises(TypeError, match="cannot use int as train data"):
        trainer().fit(5, verbose=0)
    with pytest.raises(TypeError, match="Metric instances"):
        fleetlite.Trainer(mlp(), metrics=["acc"])
    with pytest.raises(ValueError, match="no CUDA device|cuda"):
        if torch.cuda.is_available():
            raise ValueError("cuda")
        fleetlite.Trainer(mlp(), device="cuda")
    ds = dataset(10)
    bad_eval = DataLoader(ds, batch_sampler=DistributedBatchSampler(ds, 4, num_replicas=1, rank=0, drop_last=True))
    with pytest.raises(ValueError, match="eval_data cannot be evaluated exactly.*drop_last"):
        trainer().fit(ds, eval_data=bad_eval, verbose=0)
    with pytest.raises(ValueError, match="conflicts with the strategy"):
        trainer(strategy={"gradient_merge": True, "gradient_merge_configs": {"k_steps": 2}}).fit(
            dataset(4), accumulate_grad_batches=3, verbose=0)


def test_bf16_amp_strategy_trains():
    t = trainer(strategy={"amp": True, "amp_configs": {"dtype": "bfloat16"}})
    hist = t.fit(dataset(32), epochs=2, batch_size=8, verbose=0)
    assert all(torch.isfinite(torch.tensor(v)) for v in hist.history["loss"])
    assert hist.history["loss"][1] < hist.history["loss"][0]


def test_a_trainer_does_not_inherit_the_strategy_of_an_earlier_trainer():
    from fleetlite.distributed import fleet

    trainer(strategy={"amp": True, "amp_configs": {"dtype": "bfloat16"}}).fit(dataset(16), batch_size=8, verbose=0)
    plain = trainer()
    plain.fit(dataset(16), batch_size=8, verbose=0)
    assert plain.strategy.amp is False
    # ... but a strategy the user gave fleet.init applies to a Trainer built without one
    fleet.init(is_collective=True, strategy=fleet.DistributedStrategy(amp=True, amp_configs={"dtype": "bfloat16"}))
    user = trainer()
    user.fit(dataset(16), batch_size=8, verbose=0)
    assert user.strategy.amp is True
