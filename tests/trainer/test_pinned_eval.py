"""evaluate/predict (like fit) ask for pinned host batches when the Trainer's device is CUDA (mocked here)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

import fleetlite
from fleetlite.trainer import trainer as trainer_module


class _Stop(Exception):
    pass


@pytest.mark.parametrize("device, pinned", [("cpu", False), ("cuda", True)])
def test_eval_and_predict_loaders_pin_memory_on_cuda(monkeypatch, clean_dist_env, device, pinned):
    net = torch.nn.Linear(4, 2)
    t = fleetlite.Trainer(net, loss=torch.nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    t.evaluate(data, batch_size=4)  # prepared on the CPU
    seen = []

    def build(*args, **kwargs):
        seen.append((kwargs["pin_memory"], kwargs["role"]))  # build_adapter takes keywords
        raise _Stop

    monkeypatch.setattr(trainer_module, "build_adapter", build)
    monkeypatch.setattr(t._connector, "device", torch.device(device))
    for call in (lambda: t.evaluate(data, batch_size=4), lambda: t.predict(data, batch_size=4)):
        with pytest.raises(_Stop):
            call()
    assert seen == [(pinned, "eval"), (pinned, "predict")]
