"""``fleetlite.Model`` takes Paddle's ``[N, 1]`` integer labels with torch's class-index losses
(``nn.CrossEntropyLoss``, ``nn.NLLLoss``, ``F.cross_entropy``), as Paddle's ``CrossEntropyLoss`` takes them:
training, evaluation and the batch methods equal the same run with ``[N]`` labels."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import fleetlite
from fleetlite.metric import Accuracy


def _data(column: bool):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 12, generator=g)
    y = torch.randint(0, 5, (40, 1) if column else (40,), generator=g)
    return TensorDataset(x, y)


def _run(loss, column):
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(12, 5), torch.nn.LogSoftmax(-1)) if isinstance(
        loss, torch.nn.NLLLoss) else torch.nn.Linear(12, 5)
    model = fleetlite.Model(net)
    model.prepare(torch.optim.SGD(net.parameters(), lr=0.1), loss, Accuracy())
    model.fit(_data(column), batch_size=8, epochs=2, shuffle=False, verbose=0)
    result = model.evaluate(_data(column), batch_size=8, verbose=0)
    x, y = _data(column)[:8]
    batch = model.train_batch([x], [y]), model.eval_batch([x], [y])
    return [p.detach().clone() for p in net.parameters()], result, batch


@pytest.mark.parametrize("loss", [torch.nn.CrossEntropyLoss(), torch.nn.NLLLoss(), F.cross_entropy],
                         ids=["CrossEntropyLoss", "NLLLoss", "F.cross_entropy"])
def test_n_by_1_integer_labels_equal_flat_labels(loss):
    w_col, r_col, b_col = _run(loss, column=True)
    w_flat, r_flat, b_flat = _run(loss, column=False)
    for a, b in zip(w_col, w_flat):
        assert torch.equal(a, b)
    assert r_col == r_flat and 0.0 < r_col["acc"] <= 1.0
    # assert_equal counts NaN == NaN as equal: the batch results must be finite as well
    assert np.isfinite(np.concatenate([np.ravel(v) for part in b_col for v in part])).all(), b_col
    np.testing.assert_equal(b_col, b_flat)


def test_other_labels_pass_unchanged():
    from fleetlite.trainer.hapi_trainer import class_index_labels

    out, col = torch.randn(4, 3), torch.tensor([[0], [1], [2], [0]])
    seen = []
    assert class_index_labels(lambda o, y: seen.append(y), out, (col,))[0] is col  # a user's own loss
    soft = torch.rand(4, 1)
    assert class_index_labels(torch.nn.CrossEntropyLoss(), out, (soft,))[0] is soft  # float targets
    assert class_index_labels(torch.nn.CrossEntropyLoss(), out, (col,))[0].shape == (4,)
