"""The data-parallel engine: bucket plan, reducer, DataParallel."""

from .buckets import Bucket, module_units, plan_buckets
from .comm import allreduce_mean_coalesced, broadcast_coalesced
from .data_parallel import DataParallel

__all__ = ["DataParallel", "Bucket", "plan_buckets", "module_units", "allreduce_mean_coalesced", "broadcast_coalesced"]
