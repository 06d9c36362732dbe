"""predict(stack_outputs=False) with outputs whose non-batch dims differ between batches (variable-length
sequences): the batches come back as computed, in dataset order, on one rank and across 2 real ranks."""

import pytest
import torch
from torch.utils.data import Dataset

import fleetlite
from fleetlite.testing import run_ranks

N = 23


class Ramp(Dataset):
    """Sample i is the scalar i; the model's output length depends on the batch (its max sample + 1)."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor([float(i)])


class PerBatchLength(torch.nn.Module):
    """Output (batch, L) with L = 1 + the batch's largest sample mod 4: differs between batches."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        length = int(x.max().item()) % 4 + 1
        return x * self.scale + torch.arange(length, dtype=x.dtype)


def _expected(batches_of_indices):
    out = []
    for idx in batches_of_indices:
        x = torch.tensor(idx, dtype=torch.float32)[:, None]
        out.append(x + torch.arange(int(max(idx)) % 4 + 1, dtype=torch.float32))
    return out


def _predict(rank=0, world=1):
    torch.set_num_threads(1)
    t = fleetlite.Trainer(PerBatchLength(), device="cpu")
    return t.predict(Ramp(), batch_size=5)


def _check(batches):
    assert all(isinstance(b, torch.Tensor) for b in batches)
    rows = torch.cat([b[:, 0] for b in batches])
    assert rows.tolist() == [float(i) for i in range(N)]  # dataset order, each sample once, padding dropped
    for b in batches:  # each batch exactly as the model computed it for its own samples
        (want,) = _expected([[int(v) for v in b[:, 0].tolist()]])
        torch.testing.assert_close(b, want)


def test_variable_shapes_one_rank():
    batches = _predict()
    assert [b.shape[0] for b in batches] == [5, 5, 5, 5, 3]
    for b, want in zip(batches, _expected([list(range(i, min(i + 5, N))) for i in range(0, N, 5)])):
        torch.testing.assert_close(b, want)
    assert len({b.shape[1] for b in batches}) > 1  # the case that used to raise "Sizes of tensors must match"
    with pytest.raises(ValueError, match="use stack_outputs=False"):
        fleetlite.Trainer(PerBatchLength(), device="cpu").predict(Ramp(), batch_size=5, stack_outputs=True)


@pytest.mark.timeout(90)
def test_variable_shapes_two_ranks():
    for batches in run_ranks(_predict, timeout=80):
        _check(batches)
        assert sum(b.shape[0] for b in batches) == N
