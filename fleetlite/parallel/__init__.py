"""The data-parallel engine: bucket plan, reducer, DataParallel (a drop-in for torch DDP), comm hooks, join."""

from .buckets import Bucket, module_units, plan_buckets
from .comm import allreduce_mean_coalesced, broadcast_coalesced
from .comm_hooks import GradBucket
from .data_parallel import DataParallel
from .wrapped import WrappedModel

__all__ = ["DataParallel", "WrappedModel", "Bucket", "GradBucket", "plan_buckets", "module_units",
           "allreduce_mean_coalesced", "broadcast_coalesced"]
