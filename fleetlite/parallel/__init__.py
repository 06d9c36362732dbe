"""The data-parallel engine: bucket plan, reducer, its two faces (Paddle's DataParallel, torch's
DistributedDataParallel; see :mod:`fleetlite.parallel.faces`), comm hooks, join."""

from .buckets import Bucket, module_units, plan_buckets
from .comm import allreduce_mean_coalesced, broadcast_coalesced
from .comm_hooks import GradBucket
from .data_parallel import DataParallelBase
from .faces import DataParallel, DistributedDataParallel
from .wrapped import WrappedModel

__all__ = ["DataParallel", "DistributedDataParallel", "DataParallelBase", "WrappedModel", "Bucket", "GradBucket",
           "plan_buckets", "module_units", "allreduce_mean_coalesced", "broadcast_coalesced"]
