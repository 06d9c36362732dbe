"""fleetlite.metric.accuracy: Paddle's functional ``paddle.metric.accuracy`` (its documented example and a
hand-written top-k reference; the class form Accuracy agrees)."""

import pytest
import torch

from fleetlite.metric import Accuracy, accuracy


def test_paddles_documented_example():
    predictions = torch.tensor([[0.2, 0.1, 0.4, 0.1, 0.1], [0.2, 0.3, 0.1, 0.15, 0.25]], dtype=torch.float32)
    label = torch.tensor([[2], [0]], dtype=torch.int64)
    result = accuracy(input=predictions, label=label, k=1)
    assert result.shape == () and result.dtype == torch.float32 and not result.requires_grad
    assert result.item() == 0.5
    assert accuracy(predictions, label, k=2).item() == 0.5  # row 2: label 0 (0.2) is third after 0.3 and 0.25
    assert accuracy(predictions, label, k=3).item() == 1.0


@pytest.mark.parametrize("k", [1, 2, 3])
def test_against_a_hand_written_reference_and_the_class_form(k):
    g = torch.Generator().manual_seed(k)
    scores = torch.randn(50, 7, generator=g, requires_grad=True)
    labels = torch.randint(0, 7, (50, 1), generator=g)
    ranked = scores.detach().argsort(dim=1, descending=True)[:, :k]
    expected = sum(int(labels[i, 0] in ranked[i].tolist()) for i in range(50)) / 50
    assert accuracy(scores, labels, k=k).item() == pytest.approx(expected)
    assert accuracy(scores, labels[:, 0].to(torch.int32), k=k).item() == pytest.approx(expected)  # [N], int32
    metric = Accuracy(topk=(k,))
    metric.update(metric.compute(scores.detach(), labels))
    assert metric.accumulate() == pytest.approx(expected)


def test_correct_and_total_outputs_and_errors():
    correct, total = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    acc = accuracy(torch.eye(4), torch.tensor([[0], [1], [0], [0]]), k=1, correct=correct, total=total)
    assert (acc.item(), correct.item(), total.item()) == (0.5, 2, 4)
    with pytest.raises(ValueError, match="k must be"):
        accuracy(torch.eye(4), torch.zeros(4, 1, dtype=torch.int64), k=5)
    with pytest.raises(ValueError, match=r"\[N, 1\] or \[N\]"):
        accuracy(torch.eye(4), torch.zeros(3, 1, dtype=torch.int64))
    with pytest.raises(TypeError, match="integer"):
        accuracy(torch.eye(4), torch.zeros(4, 1))
