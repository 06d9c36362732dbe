"""fleetlite.io.DataLoader is torch's DataLoader and, as Paddle's, callable: ``for data in loader():``."""

import torch
import torch.utils.data

from fleetlite.io import DataLoader, TensorDataset, TensorLoader


def test_dataloader_is_torchs_and_callable_as_paddles():
    data = TensorDataset(torch.arange(10.0), torch.arange(10))
    loader = DataLoader(data, batch_size=4, shuffle=False, drop_last=False)
    assert isinstance(loader, torch.utils.data.DataLoader)
    called = [tuple(t.tolist() for t in batch) for batch in loader()]
    iterated = [tuple(t.tolist() for t in batch) for batch in loader]
    reference = [tuple(t.tolist() for t in batch) for batch in torch.utils.data.DataLoader(data, batch_size=4)]
    assert called == iterated == reference and len(called) == 3
    it = loader()  # a fresh iterator each call, as Paddle's __call__ returns iter(self)
    next(it)
    assert len(list(loader())) == 3


def test_paddle_training_loop_runs_unchanged():
    data = TensorDataset(torch.randn(8, 3), torch.randint(0, 2, (8, 1)))
    train_loader = DataLoader(data, batch_size=4, shuffle=True)
    steps = 0
    for _epoch in range(2):
        for _batch_id, (x, y) in enumerate(train_loader()):
            assert x.shape == (4, 3) and y.shape == (4, 1)
            steps += 1
    assert steps == 4


def test_tensor_loader_is_callable_too():
    images = torch.randint(0, 255, (6, 3, 8, 8), dtype=torch.uint8)
    loader = TensorLoader(images, torch.arange(6), batch_size=4, shuffle=False, augment=False, num_replicas=1,
                          rank=0)
    assert [y.tolist() for _, y in loader()] == [y.tolist() for _, y in loader] == [[0, 1, 2, 3], [4, 5]]
