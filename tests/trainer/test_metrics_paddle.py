"""fleetlite.metric against Paddle's own metric tests (test_metrics.py, ported) and Paddle's documented numbers,
plus the single-column case where Paddle's top-1 gives a plausible wrong number."""

import numpy as np
import pytest
import torch

from fleetlite.metric import Accuracy, Auc, Metric, Precision, Recall


def _np_accuracy(pred, label, topk=(1,)):
    """Paddle's reference implementation of the test (numpy)."""
    maxk = max(topk)
    pred = np.argsort(pred)[..., ::-1][..., :maxk]
    if len(label.shape) == 1:
        label = label.reshape(-1, 1)
    elif label.shape[-1] != 1:
        label = np.argmax(label, axis=-1)[..., np.newaxis]
    correct = pred == np.repeat(label, maxk, -1)
    total = np.prod(np.array(label.shape[:-1]))
    return [float(correct[..., :k].sum()) / total for k in topk]


@pytest.mark.parametrize("squeeze", [False, True])
def test_accuracy_paddle_example(squeeze):
    x = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.1, 0.4, 0.3, 0.2], [0.1, 0.2, 0.4, 0.3], [0.1, 0.2, 0.3, 0.4]])
    y = np.array([[0], [1], [2], [3]])
    y = torch.tensor(y.squeeze() if squeeze else y)
    m = Accuracy(name="my_acc")
    assert m.name() == ["my_acc"]
    correct = m.compute(x, y)
    assert list(correct.shape) == [4, 1]
    assert m.update(correct) == 0.75 and m.accumulate() == 0.75
    x2 = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.1, 0.3, 0.4, 0.2], [0.1, 0.2, 0.4, 0.3], [0.1, 0.2, 0.3, 0.4]])
    assert m.update(m.compute(x2, torch.tensor([[0], [1], [2], [3]]))) == 0.5
    assert m.accumulate() == 0.625
    assert m.total == [5.0] and m.count == [8]
    m.reset()
    assert m.total[0] == 0.0 and m.count[0] == 0 and np.sum(m.total) == 0


def test_accuracy_keeps_leading_dims_one_hot_numpy_and_multi_k():
    rng = np.random.default_rng(0)
    x, y = rng.random((2, 3, 4)), rng.integers(4, size=(2, 3, 1))
    m = Accuracy(name="my_acc")
    correct = m.compute(torch.tensor(x), torch.tensor(y))
    assert list(correct.shape) == [2, 3, 1]
    assert m.update(correct) == _np_accuracy(x, y)[0] and m.count == [6]
    y2 = rng.integers(4, size=(2, 3))
    onehot = np.eye(4)[y2]
    m = Accuracy(name="my_acc", topk=(1, 2))
    correct = m.compute(torch.tensor(x), torch.tensor(onehot))
    assert list(correct.shape) == [2, 3, 2]
    assert m.update(correct.numpy()) == _np_accuracy(x, onehot, (1, 2))  # update takes numpy, returns a list
    assert m.accumulate() == _np_accuracy(x, onehot, (1, 2)) and m.name() == ["my_acc_top1", "my_acc_top2"]


@pytest.mark.parametrize("topk,squeeze", [((1,), False), ((1, 5), True)])
def test_accuracy_random_batches_like_paddle(topk, squeeze):
    rng = np.random.default_rng(1)
    acc = Accuracy(topk=topk)
    for _ in range(5):
        label = rng.integers(0, 10, (1000, 1))
        label = label.squeeze() if squeeze else label
        pred = rng.random((1000, 10)).astype("float32")
        state = acc.compute(torch.tensor(pred), torch.tensor(label))
        acc.update(state.numpy())
        res = acc.accumulate()
        np.testing.assert_allclose(np.array(res, dtype="float64"), _np_accuracy(pred, label, topk), rtol=1e-12,
                                   equal_nan=False)
        acc.reset()
        assert np.sum(acc.total) == 0 and np.sum(acc.count) == 0


def test_accuracy_single_column_is_binary_accuracy_not_top1():
    probs = torch.tensor([[0.9], [0.2], [0.7], [0.1]])
    labels = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    m = Accuracy()
    assert m.update(m.compute(probs, labels)) == 1.0  # Paddle's top-1 of one column would say 0.5
    m = Accuracy(threshold=0.0)  # logits
    assert m.update(m.compute(torch.tensor([[2.0], [-1.0], [0.5], [-3.0]]), labels.squeeze())) == 1.0
    with pytest.raises(ValueError, match="logits"):
        Accuracy().compute(torch.tensor([[2.0], [-1.0]]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="top-k"):
        Accuracy(topk=(1, 2)).compute(probs, labels)


def test_precision_recall_paddle_numbers():
    m = Precision()
    m.update(np.array([0.1, 0.5, 0.6, 0.7]), np.array([1, 0, 1, 1]))
    assert m.accumulate() == pytest.approx(2 / 3)
    m.update(torch.tensor([0.1, 0.5, 0.6, 0.7, 0.2]), torch.tensor([1, 0, 1, 1, 1]))
    assert m.accumulate() == pytest.approx(4 / 6)
    m = Precision()
    m.update(np.array([0.1, 0.5, 0.6, 0.7]).reshape(-1, 1), np.array([1, 0, 1, 1]).reshape(-1, 1))
    assert m.accumulate() == pytest.approx(2 / 3) and m.tp == 2 and m.fp == 1
    m.reset()
    assert m.tp == 0 and m.fp == 0 and m.accumulate() == 0.0
    r = Recall()
    r.update(np.array([0.1, 0.5, 0.6, 0.7]), np.array([1, 0, 1, 1]))
    assert r.accumulate() == pytest.approx(2 / 3)
    r.update(torch.tensor([0.1, 0.5, 0.6, 0.7]), torch.tensor([1, 0, 0, 1]))
    assert r.accumulate() == pytest.approx(3 / 5)
    r.reset()
    assert r.tp == 0 and r.fn == 0 and r.accumulate() == 0.0
    # Paddle's rounding: Precision counts p == 0.5 as positive (floor(p + .5)), Recall does not (rint)
    p, r = Precision(), Recall()
    p.update(np.array([0.5]), np.array([1]))
    r.update(np.array([0.5]), np.array([1]))
    assert p.tp == 1 and r.tp == 0
    with pytest.raises(ValueError, match="numpy ndarray or a torch.Tensor"):
        Precision().update([0.1], [1])


def _paddle_auc_loop(preds, labels, n=4095):
    pos, neg = np.zeros(n + 1), np.zeros(n + 1)
    for i, lbl in enumerate(labels):
        b = int(preds[i, 1] * n)
        (pos if lbl else neg)[b] += 1.0
    tot_pos = tot_neg = auc = 0.0
    for idx in range(n, -1, -1):
        pp, pn = tot_pos, tot_neg
        tot_pos += pos[idx]
        tot_neg += neg[idx]
        auc += abs(tot_neg - pn) * (tot_pos + pp) / 2.0
    return auc / tot_pos / tot_neg if tot_pos > 0 and tot_neg > 0 else 0.0


def test_auc_paddle_numbers():
    x = np.array([[0.78, 0.22], [0.62, 0.38], [0.55, 0.45], [0.30, 0.70], [0.14, 0.86], [0.59, 0.41], [0.91, 0.08],
                  [0.16, 0.84]])
    y = np.array([[0], [1], [1], [0], [1], [0], [0], [1]])
    for conv in (lambda a: a, torch.tensor):
        m = Auc()
        m.update(conv(x), conv(y))
        assert m.accumulate() == pytest.approx(0.8125)
        m.reset()
        assert m.accumulate() == 0.0
    rng = np.random.default_rng(3)
    for dtype, nt in (("float64", 4095), ("float32", 4095), ("float64", 7)):
        p1 = rng.random(500).astype(dtype)
        preds = np.stack([1 - p1, p1], 1)
        labels = rng.integers(0, 2, (500, 1))
        m = Auc(num_thresholds=nt)
        m.update(preds[:200], labels[:200])
        m.update(torch.tensor(preds[200:]), torch.tensor(labels[200:]))
        assert m.accumulate() == _paddle_auc_loop(preds, labels, nt)  # bit-equal to Paddle's loop
    with pytest.raises(ValueError, match="probabilities in"):
        Auc().update(np.array([[0.2, 1.5]]), np.array([1]))


def test_metric_base_is_paddle_protocol():
    class Mae(Metric):
        def __init__(self):
            super().__init__()
            self.add_state("s", torch.zeros((), dtype=torch.float64))
            self.add_state("n", torch.zeros((), dtype=torch.float64))

        def update(self, pred, label):
            self.s += (pred - label).abs().sum()
            self.n += len(label)

        def accumulate(self):
            return float(self.s / self.n)

        def name(self):
            return "mae"

    m = Mae()
    assert m.compute(1, 2) == (1, 2)
    m.update(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0]))
    assert m.accumulate() == 1.5
