"""fleetlite.io: Paddle's ``paddle.io`` names on torch, plus the fast tensor pipeline and exact evaluation.

* :class:`DistributedBatchSampler` - per-rank batches with Paddle's layout;
  stateful (resume mid-epoch, re-split at another world size); marks padding.
* :class:`TensorLoader` - the batched uint8-tensor input pipeline (crop, flip,
  normalise on the device).
* :func:`drop_padding`, :func:`global_sum` - exact distributed evaluation.
* ``DataLoader`` - torch's, also callable as Paddle's (``for data in loader():``).
* ``Dataset``, ``TensorDataset``... - torch's own classes.

Importing this package does not import torchvision.

Example::

    from fleetlite.io import DataLoader, DistributedBatchSampler
    sampler = DistributedBatchSampler(dataset, batch_size=64, shuffle=True)
    loader = DataLoader(dataset, batch_sampler=sampler)
"""

from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    Subset,
    TensorDataset,
    get_worker_info,
    random_split,
)

from .evaluation import drop_padding, find_batch_sampler, global_sum, trim_batch
from .loader import DataLoader, TensorLoader
from .sampler import DistributedBatchSampler

SequenceSampler = SequentialSampler  # Paddle's name

__all__ = [
    "DistributedBatchSampler",
    "TensorLoader",
    "drop_padding",
    "global_sum",
    "find_batch_sampler",
    "trim_batch",
    "DataLoader",
    "Dataset",
    "IterableDataset",
    "TensorDataset",
    "ConcatDataset",
    "Subset",
    "random_split",
    "BatchSampler",
    "Sampler",
    "RandomSampler",
    "SequentialSampler",
    "SequenceSampler",
    "get_worker_info",
]
