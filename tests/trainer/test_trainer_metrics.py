"""Metrics: Paddle's protocol, exact cross-rank sums, padding never counted."""

import pytest
import torch

import fleetlite
from fleetlite.testing import run_ranks
from fleetlite.trainer.metrics import Accuracy, Metric, MetricReductionError, reduce_sums


def _logits_labels(n, c=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g), torch.randint(0, c, (n,), generator=g)


def test_accuracy_matches_manual_topk():
    pred, label = _logits_labels(37)
    m = Accuracy(topk=(1, 3))
    assert m.name() == ["acc_top1", "acc_top3"]
    for lo in range(0, 37, 10):
        m.update(m.compute(pred[lo:lo + 10], label[lo:lo + 10].unsqueeze(1)))  # (N, 1) labels too
    top3 = pred.topk(3, dim=1).indices
    want1 = (top3[:, 0] == label).sum().item() / 37
    want3 = (top3 == label[:, None]).any(1).sum().item() / 37
    assert m.accumulate() == pytest.approx([want1, want3], abs=1e-12)
    assert m.count.item() == 37
    m.reset()
    assert m.count.item() == 0 and m.accumulate() == [0.0, 0.0]


def test_accuracy_single_k_returns_float_and_batch_value():
    m = Accuracy()
    assert m.name() == ["acc"]
    batch_acc = m.update(m.compute(torch.tensor([[2.0, 1.0], [0.0, 3.0]]), torch.tensor([0, 0])))
    assert batch_acc == 0.5 and m.accumulate() == 0.5


def test_accuracy_rejects_bad_arguments():
    with pytest.raises(ValueError, match="positive integer"):
        Accuracy(topk=(0,))
    with pytest.raises(ValueError, match="at least 5 classes"):
        Accuracy(topk=(5,)).compute(torch.randn(2, 3), torch.tensor([0, 1]))


def test_metric_state_dict_roundtrip_and_add_state_checks():
    m = Accuracy()
    m.update(m.compute(*_logits_labels(10)))
    m2 = Accuracy()
    m2.load_state_dict(m.state_dict())
    assert m2.accumulate() == m.accumulate()
    with pytest.raises(TypeError, match="torch.Tensor"):
        m.add_state("x", 0.0)

    class Early(Metric):
        def __init__(self):
            self.add_state("x", torch.zeros(()))

    with pytest.raises(RuntimeError, match="super"):
        Early()


class PythonStateMetric(Metric):
    """A Paddle-style metric keeping plain python state: not reducible exactly."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def update(self, *args):
        self.total += 1

    def accumulate(self):
        return self.total

    def name(self):
        return "n"


def _reduce_on_ranks(rank, world):
    pred, label = _logits_labels(23, seed=3)
    # rank r sees an uneven share, as a padded last batch would leave it after trimming
    lo, hi = (0, 15) if rank == 0 else (15, 23)
    m = Accuracy(topk=(1, 2))
    m.update(m.compute(pred[lo:hi], label[lo:hi]))
    loss_sum = reduce_sums([m], torch.tensor([float(hi - lo), 1.0], dtype=torch.float64))
    try:
        reduce_sums([PythonStateMetric()])
        err = None
    except MetricReductionError as e:
        err = str(e)
    return m.accumulate(), m.count.item(), loss_sum.tolist(), err


@pytest.mark.timeout(60)
def test_reduction_sums_counts_across_ranks():
    pred, label = _logits_labels(23, seed=3)
    ref = Accuracy(topk=(1, 2))
    ref.update(ref.compute(pred, label))
    for acc, count, extra, err in run_ranks(_reduce_on_ranks):
        assert acc == ref.accumulate()  # exact: sums of counts, not averages of averages
        assert count == 23
        assert extra == [23.0, 2.0]
        assert "add_state" in err


def test_reduce_is_noop_single_process():
    m = PythonStateMetric()
    assert reduce_sums([m], None) is None  # no process group: nothing to reduce, no error


def test_public_names():
    assert fleetlite.metric.Accuracy is Accuracy and fleetlite.metric.Metric is Metric
