"""Paddle's metrics and torchmetrics metrics in Trainer.evaluate on 2 and 3 real ranks equal one process
(odd sizes: the distributed sampler pads, and padding must not be counted)."""

import pytest
import torch
from torch import nn

import fleetlite
from fleetlite.metric import Accuracy, Auc, Precision, Recall
from fleetlite.testing import run_ranks

N = 29


def _data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, 5, generator=g)
    yb = (x[:, 0] + 0.3 * torch.randn(N, generator=g) > 0).float().unsqueeze(1)
    yc = torch.randint(0, 4, (N,), generator=g)
    return x, yb, yc


def _binary_trainer(metrics):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 1), nn.Sigmoid())
    return fleetlite.Trainer(net, None, nn.BCELoss(), metrics=metrics, device="cpu")


def _paddle_metrics(rank=0, world=1):
    torch.set_num_threads(1)
    x, yb, yc = _data()
    out = _binary_trainer([Accuracy(), Precision(), Recall(), Auc()]).evaluate((x, yb), batch_size=4, verbose=0)
    torch.manual_seed(1)
    multi = fleetlite.Trainer(nn.Linear(5, 4), None, nn.CrossEntropyLoss(), metrics=Accuracy(topk=(1, 2)),
                              device="cpu")
    out.update({f"multi_{k}": v for k, v in multi.evaluate((x, yc), batch_size=3, verbose=0).items()})
    return out


def test_paddle_metrics_exact_single_process_reference():
    ref = _paddle_metrics()
    x, yb, _ = _data()
    with torch.no_grad():
        p = _binary_trainer(None).network(x)
    a, pr, rc, auc = Accuracy(), Precision(), Recall(), Auc()
    a.update(a.compute(p, yb))
    pr.update(p, yb)
    rc.update(p, yb)
    auc.update(p, yb)
    assert ref["acc"] == a.accumulate() and ref["precision"] == pr.accumulate()
    assert ref["recall"] == rc.accumulate() and ref["auc"] == auc.accumulate()
    assert 0 < ref["auc"] < 1 and 0 < ref["precision"] < 1


@pytest.mark.parametrize("world", [1, 2, 3])
def test_paddle_metrics_exact_across_ranks(world):
    ref = _paddle_metrics()
    for got in run_ranks(_paddle_metrics, world_size=world, timeout=240):
        assert got.keys() == ref.keys()
        for k in ref:
            if k.endswith("loss"):
                assert got[k] == pytest.approx(ref[k], rel=1e-6)
            else:
                assert got[k] == ref[k], k


def _torchmetrics(rank=0, world=1):
    import torchmetrics

    torch.set_num_threads(1)
    x, yb, _ = _data()
    ms = [torchmetrics.classification.BinaryF1Score(), torchmetrics.classification.BinaryAUROC()]
    t = _binary_trainer(ms)
    out = t.evaluate((x, yb), batch_size=4, verbose=0)
    hist = t.compile(torch.optim.SGD(t.network.parameters(), lr=0.1), nn.BCELoss(), ms)
    hist = t.fit((x, yb), epochs=1, batch_size=4, verbose=0).history
    out["fit_f1"] = hist["binaryf1score"][0]
    return out


def test_torchmetrics_exact_across_two_ranks():
    pytest.importorskip("torchmetrics")
    import torchmetrics

    ref = _torchmetrics()
    x, yb, _ = _data()
    with torch.no_grad():
        p = _binary_trainer(None).network(x)
    assert ref["binaryf1score"] == pytest.approx(float(torchmetrics.functional.classification.binary_f1_score(
        p.squeeze(1), yb.squeeze(1).long())), abs=1e-7)
    assert ref["binaryauroc"] == pytest.approx(float(torchmetrics.functional.classification.binary_auroc(
        p.squeeze(1), yb.squeeze(1).long())), abs=1e-7)
    for got in run_ranks(_torchmetrics, world_size=2, timeout=240):
        assert got["binaryf1score"] == pytest.approx(ref["binaryf1score"], abs=1e-7)
        assert got["binaryauroc"] == pytest.approx(ref["binaryauroc"], abs=1e-7)
