"""Sharded data parallelism (ZeRO): stage 1 on ``ZeroRedundancyOptimizer``, stages 2/3 and hybrid sharding on
torch FSDP2, and Paddle's ``group_sharded_parallel`` / ``save_group_sharded_model``.

Example::

    from fleetlite.distributed.sharding import group_sharded_parallel
    model, opt, _ = group_sharded_parallel(net, torch.optim.AdamW(net.parameters()), level="os_g")
"""

from .group_sharded import group_sharded_parallel, save_group_sharded_model
from .model import ShardedDataParallel, is_sharded_model

__all__ = ["ShardedDataParallel", "group_sharded_parallel", "save_group_sharded_model", "is_sharded_model"]
