"""One view of whatever data the Trainer is given: one small :class:`DataAdapter` class per input kind, and
:func:`build_adapter`, the factory that picks one.

========================== =========================================================================
input                      adapter
========================== =========================================================================
tensors ``(x, y)``,        :class:`TensorAdapter` (``tensors``): a ``DistributedBatchSampler`` picks each
``TensorDataset``          batch's indices, each tensor is indexed once per batch
map-style ``Dataset``      :class:`SampledAdapter` (``sampled``) over a ``DataLoader`` driven by a
                           ``DistributedBatchSampler``
``DataLoader`` with a      :class:`SampledAdapter`: used as it is, the sampler's cursor for positions
``DistributedBatchSampler`` and padding
``TensorLoader``           :class:`PipelineAdapter` (``sampled``)
``DataLoader`` with        :class:`TorchDistributedAdapter` (``loaders``): padding from torch's
torch's ``DistributedSampler`` interleaved layout, so evaluation is still exact
plain ``DataLoader``,      rebuilt over a ``DistributedBatchSampler`` (``split_plain_loader``), or
several ranks              kept whole with a warning when its sampler is custom
any other iterable         :class:`DataAdapter` (``base``): the whole data on every rank, not sharded;
                           mid-epoch resume replays it (Note [resume replay] in
                           :mod:`fleetlite.trainer.checkpoint_connector`)
========================== =========================================================================

Batch helpers of the loops (``batch_length``, ``to_device``, Keras' ``(x, y)`` arguments) are in
``batches``; :class:`LimitedAdapter` (``limited``) cuts another adapter short.
"""

from .base import DataAdapter, describe_sizes
from .batches import batch_length, keras_evaluate_args, keras_xy, to_device
from .factory import build_adapter
from .limited import LimitedAdapter
from .loaders import TorchDistributedAdapter
from .sampled import PipelineAdapter, SampledAdapter
from .tensors import TensorAdapter

__all__ = ["DataAdapter", "build_adapter", "TensorAdapter", "SampledAdapter", "PipelineAdapter",
           "TorchDistributedAdapter", "LimitedAdapter", "batch_length", "to_device", "keras_xy",
           "keras_evaluate_args", "describe_sizes"]
