"""Paddle's sharding API: ``group_sharded_parallel`` / ``save_group_sharded_model`` over the ``fleet`` facade.

Stage 1 runs on ``ZeroRedundancyOptimizer``, stages 2/3 and hybrid sharding on
the FSDP2 engine in :mod:`fleetlite.parallel.sharded` (:class:`ShardedDataParallel`,
re-exported here). A facade, like ``fleet``: the engine below never imports it.

Example::

    from fleetlite.distributed.sharding import group_sharded_parallel
    model, opt, _ = group_sharded_parallel(net, torch.optim.AdamW(net.parameters()), level="os_g")
"""

from ...parallel.sharded import ShardedDataParallel, is_sharded_model
from .group_sharded import group_sharded_parallel, save_group_sharded_model

__all__ = ["ShardedDataParallel", "group_sharded_parallel", "save_group_sharded_model", "is_sharded_model"]
