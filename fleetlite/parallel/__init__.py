"""The data-parallel engine: bucket plan, reducer, DataParallel."""

from .buckets import Bucket, plan_buckets
from .comm import allreduce_mean_coalesced, broadcast_coalesced
from .data_parallel import DataParallel

__all__ = ["DataParallel", "Bucket", "plan_buckets", "allreduce_mean_coalesced", "broadcast_coalesced"]
