"""The Trainer asks the wrapped model how its batches run (Note [step runners]): a user's wrapped model that
declares its own step runner (``step_runner = <factory>``) is driven through it, for fit, evaluate, predict and the
checks before fit; the runner's ``rows`` is evaluate's and predict's default batch size; an unknown runner name is
one clear error before any step.

References: a plain torch loop (SGD over the same batches) for the losses and weights, and the network's own
forward for the predictions."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from trainer_helpers import dataset, mlp, xy

import fleetlite
from fleetlite.trainer.steps import DefaultSteps

N, BATCH, EPOCHS, LR, ROWS = 20, 4, 2, 0.1, 5


class CountingSteps(DefaultSteps):
    """A user's runner: the default steps, each call counted; 5 rows by default (not Keras' 32)."""

    rows = ROWS

    def __init__(self, trainer, net) -> None:
        super().__init__(trainer, net)
        self.calls = {"train": 0, "eval": 0, "predict": 0, "check_fit": 0}

    def train_step(self, batch):
        self.calls["train"] += 1
        return super().train_step(batch)

    def eval_step(self, batch):
        self.calls["eval"] += 1
        return super().eval_step(batch)

    def predict_step(self, batch):
        self.calls["predict"] += 1
        return super().predict_step(batch)

    def check_fit(self, train, accumulate, weighted) -> None:
        self.calls["check_fit"] += 1


class CountedModel(fleetlite.DataParallel):
    step_runner = CountingSteps  # the Trainer drives this model through CountingSteps


class RefusingSteps(DefaultSteps):
    def check_fit(self, train, accumulate, weighted) -> None:
        raise ValueError("this runner trains nothing")


class RefusingModel(fleetlite.DataParallel):
    step_runner = RefusingSteps


class UnknownRunnerModel(fleetlite.DataParallel):
    step_runner = "no-such-runner"


def _reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """Epoch mean losses and final weights of a plain torch loop: SGD over the batches in order."""
    net = mlp(seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    x, y = xy(N)
    losses = []
    for _ in range(EPOCHS):
        total = torch.zeros((), dtype=torch.float64)
        for i in range(0, N, BATCH):
            loss = nn.functional.cross_entropy(net(x[i:i + BATCH]), y[i:i + BATCH])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.detach().double() * BATCH
        losses.append(float(total / N))
    return losses, {k: v.detach().clone() for k, v in net.state_dict().items()}


def _trainer(wrapper) -> fleetlite.Trainer:
    net = mlp(seed=0)
    return fleetlite.Trainer(wrapper(net), torch.optim.SGD(net.parameters(), lr=LR), nn.CrossEntropyLoss(),
                             device="cpu")


def test_a_wrapped_model_declaring_its_runner_is_trained_evaluated_and_predicted_through_it():
    t = _trainer(CountedModel)
    history = t.fit(dataset(N), epochs=EPOCHS, batch_size=BATCH, shuffle=False, verbose=0).history
    steps = t.steps
    assert isinstance(steps, CountingSteps)
    assert steps.calls["train"] == EPOCHS * N // BATCH
    assert steps.calls["check_fit"] == 1  # asked before the first step
    ref_losses, ref_weights = _reference()
    torch.testing.assert_close(torch.tensor(history["loss"], dtype=torch.float64),
                               torch.tensor(ref_losses, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    for k, v in ref_weights.items():
        torch.testing.assert_close(t.network.state_dict()[k], v, rtol=1e-6, atol=1e-6)

    x, y = xy(N)
    logs = t.evaluate(dataset(N), verbose=0)  # no batch_size: the runner's rows
    assert steps.calls["eval"] == math.ceil(N / ROWS)
    with torch.no_grad():
        ref_loss = nn.functional.cross_entropy(t.network(x), y)
    torch.testing.assert_close(torch.tensor(logs["loss"]), ref_loss, rtol=1e-6, atol=1e-6)

    batches = t.predict(x)  # no batch_size: the runner's rows
    assert steps.calls["predict"] == math.ceil(N / ROWS)
    assert [b.shape[0] for b in batches] == [ROWS] * (N // ROWS)
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(batches), t.network(x), rtol=1e-6, atol=1e-6)


def test_the_runners_checks_refuse_fit_before_any_step():
    t = _trainer(RefusingModel)
    before = {k: v.detach().clone() for k, v in t.network.state_dict().items()}
    with pytest.raises(ValueError, match="this runner trains nothing"):
        t.fit(dataset(N), batch_size=BATCH, verbose=0)
    assert t.global_step == 0
    for k, v in before.items():
        torch.testing.assert_close(t.network.state_dict()[k], v, rtol=0, atol=0)


def test_an_unknown_runner_name_is_one_error_naming_the_runners():
    t = _trainer(UnknownRunnerModel)
    with pytest.raises(ValueError, match=r"step_runner = 'no-such-runner' names no step runner: use one of "
                                         r"\['default', 'pipeline'\]"):
        t.evaluate(dataset(N), verbose=0)
