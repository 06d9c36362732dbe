"""predict(output_dir=...): batches streamed to disk per rank, merged by rank 0 into .npy files in dataset
order without duplicates; equal to the in-memory predict (1 and 2 real ranks, padded last batches);
several outputs; outputs whose shape varies per batch kept batch by batch in dataset order."""

import numpy as np
import pytest
import torch
from test_predict_batches import PerBatchLength, Ramp
from torch import nn
from trainer_helpers import dataset, trainer

import fleetlite
from fleetlite.testing import run_ranks

N = 37  # odd: the ranks' last batches are padded


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(6, 3), nn.Linear(6, 2)

    def forward(self, x):
        return self.a(x), self.b(x).to(torch.float64)


def _streamed(rank, world, out):
    torch.set_num_threads(1)
    paths = trainer().predict(dataset(N, seed=4), batch_size=5, output_dir=out)
    return [str(p) for p in paths]


def test_one_rank_equals_in_memory(tmp_path):
    t = trainer()
    (path,) = t.predict(dataset(N, seed=4), batch_size=5, output_dir=tmp_path / "p")
    assert path == tmp_path / "p" / "predictions.npy"
    want = t.predict(dataset(N, seed=4), batch_size=5, stack_outputs=True)
    np.testing.assert_allclose(np.load(path), want.numpy(), rtol=0, atol=0, equal_nan=False)
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["predictions.npy"]  # shards removed


def test_several_outputs(tmp_path):
    t = fleetlite.Trainer(TwoHeads(), device="cpu")
    paths = t.predict(dataset(11), batch_size=4, output_dir=tmp_path)
    assert [p.name for p in paths] == ["predictions_0.npy", "predictions_1.npy"]
    a, b = t.predict(dataset(11), batch_size=4, stack_outputs=True)
    np.testing.assert_allclose(np.load(paths[0]), a.numpy(), rtol=0, atol=0, equal_nan=False)
    assert np.load(paths[1]).dtype == np.float64
    np.testing.assert_allclose(np.load(paths[1]), b.numpy(), rtol=0, atol=0, equal_nan=False)


def test_variable_shapes_kept_per_batch(tmp_path):
    t = fleetlite.Trainer(PerBatchLength(), device="cpu")
    (path,) = t.predict(Ramp(), batch_size=5, output_dir=tmp_path)
    assert path.is_dir()
    got = [torch.load(p) for p in sorted(path.iterdir())]
    for g, w in zip(got, t.predict(Ramp(), batch_size=5), strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.timeout(90)
def test_two_ranks_merge_in_dataset_order(tmp_path):
    out = str(tmp_path / "preds")
    results = run_ranks(_streamed, args=(out,), timeout=80)
    assert results[0] == results[1] == [out + "/predictions.npy"]
    want = trainer().predict(dataset(N, seed=4), batch_size=5, stack_outputs=True)
    got = np.load(results[0][0])
    assert got.shape == (N, 3)  # padding repeats dropped: each sample once
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6, equal_nan=False)
