"""``fleetlite.Trainer`` with ``[N, 1]`` integer labels and torch's ``CrossEntropyLoss``/``NLLLoss`` trains as with
``[N]`` labels (Keras' sparse categorical cross-entropy takes both shapes; ``fleetlite.Model`` already did).

Reference: a plain torch loop over the same batches with ``[N]`` labels."""

import pytest
import torch
from torch import nn

import fleetlite


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)


def _net(log_softmax: bool) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 3), nn.LogSoftmax(-1)) if log_softmax else nn.Linear(6, 3)


@pytest.mark.parametrize("loss", [nn.CrossEntropyLoss(), nn.NLLLoss()], ids=["CrossEntropyLoss", "NLLLoss"])
def test_n_by_1_labels_train_as_a_plain_loop_with_flat_labels(loss):
    x, y = _data()
    ref = _net(isinstance(loss, nn.NLLLoss))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(2):
        for i in range(0, 32, 8):
            opt.zero_grad()
            loss(ref(x[i:i + 8]), y[i:i + 8]).backward()
            opt.step()
    ref_eval = loss(ref(x), y)

    net = _net(isinstance(loss, nn.NLLLoss))
    t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), loss, device="cpu")
    t.fit((x, y.view(-1, 1)), epochs=2, batch_size=8, shuffle=False, verbose=0)
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    got = t.evaluate((x, y.view(-1, 1)), batch_size=32, verbose=0)["loss"]
    torch.testing.assert_close(torch.tensor(got), ref_eval.detach(), rtol=1e-6, atol=1e-7)
