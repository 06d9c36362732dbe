"""The Trainer on 2 real ranks against single-process references: exact evaluate (odd sizes, three kinds of
data), predict in dataset order without duplicates, fit equal to one process with the global batch,
progress printed by rank 0 only."""

import io

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler
from trainer_helpers import dataset, params, trainer, xy

from fleetlite.io import TensorLoader
from fleetlite.testing import run_ranks
from fleetlite.trainer import callbacks as C

N_EVAL = 37  # odd: the last local batches are padded


def _images(n):
    g = torch.Generator().manual_seed(5)
    return torch.randint(0, 256, (n, 3, 4, 4), dtype=torch.uint8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _image_trainer():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 3))
    from fleetlite.trainer.metrics import Accuracy

    return __import__("fleetlite").Trainer(net, None, torch.nn.CrossEntropyLoss(), metrics=Accuracy(topk=(1, 2)),
                                           device="cpu")


def _eval_predict(rank=0, world=1):
    torch.set_num_threads(1)
    ds = dataset(N_EVAL, seed=4)
    t = trainer()
    out = {"dataset": t.evaluate(ds, batch_size=8, verbose=0)}
    sampler = DistributedSampler(ds, shuffle=False) if world > 1 else None
    out["torch_sampler"] = t.evaluate(DataLoader(ds, batch_size=8, sampler=sampler), verbose=0)
    x, y = _images(N_EVAL)
    loader = TensorLoader(x, y, 8, shuffle=False, augment=False, mean=(0.5,) * 3, std=(0.25,) * 3)
    out["tensor_loader"] = _image_trainer().evaluate(loader, verbose=0)
    out["predict"] = t.predict(ds, batch_size=8, stack_outputs=True)
    out["predict_batches"] = t.predict(ds, batch_size=10)
    return out


def _fit(rank=0, world=1, batch_size=8):
    torch.set_num_threads(1)
    t = trainer(lr=0.1)
    t.compile(torch.optim.SGD(t.network.parameters(), lr=0.2), t.loss_fn, t.metrics)
    stream = io.StringIO()
    hist = t.fit(dataset(40), epochs=2, batch_size=batch_size, shuffle=True, seed=3, log_freq=2,
                 callbacks=[C.ProgressBar(stream=stream)])
    return params(t), hist.history, stream.getvalue()


def _on_ranks(rank, world):
    return _eval_predict(rank, world), _fit(rank, world, batch_size=4)


@pytest.mark.timeout(90)
def test_two_ranks_match_single_process():
    ranks = run_ranks(_on_ranks, timeout=80)
    ref = _eval_predict()
    ref_params, ref_hist, ref_text = _fit(batch_size=8)  # the same global batches on one process
    for (dist, (p, hist, text)), rank in zip(ranks, (0, 1)):
        for kind in ("dataset", "torch_sampler", "tensor_loader"):
            got, want = dist[kind], ref[kind]
            assert got["acc_top1"] == want["acc_top1"] and got["acc_top2"] == want["acc_top2"], kind  # exact
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), kind
        assert dist["predict"].shape == (N_EVAL, 3)
        torch.testing.assert_close(dist["predict"], ref["predict"], rtol=1e-5, atol=1e-6)
        assert [b.shape[0] for b in dist["predict_batches"]] == [10, 10, 10, 7]
        torch.testing.assert_close(torch.cat(dist["predict_batches"]), ref["predict"], rtol=1e-5, atol=1e-6)
        for k in ref_params:
            torch.testing.assert_close(p[k], ref_params[k], rtol=1e-5, atol=1e-6, msg=k)
        assert hist["loss"] == pytest.approx(ref_hist["loss"], rel=1e-5)
        assert hist["acc_top1"] == ref_hist["acc_top1"]
        if rank == 0:
            assert "Epoch 1/2 step 2/5" in text and "Epoch 2/2 done - loss:" in text  # 1-based label
        else:
            assert text == ""  # progress is printed by rank 0 only
    assert ref_text.count("done") == 2
    x, y = xy(N_EVAL, seed=4)
    manual = trainer().network(x)
    torch.testing.assert_close(ref["predict"], manual.detach(), rtol=1e-5, atol=1e-6)  # dataset order
