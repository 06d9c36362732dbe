"""The sharded engine (ZeRO stages 2/3, hybrid sharding) on torch FSDP2, and the optimizer helpers it needs.

The engine below the ``fleet`` facade, as :class:`fleetlite.DataParallel` is
for plain data parallelism. Users reach it through ``fleet.distributed_model``
(``strategy.sharding``) or Paddle's
:func:`fleetlite.distributed.sharding.group_sharded_parallel`, which also
re-exports :class:`ShardedDataParallel`.

Example::

    from fleetlite.parallel.sharded import ShardedDataParallel
    model = ShardedDataParallel(net, stage=3)   # in a process group
"""

from .model import ShardedDataParallel, is_sharded_model

__all__ = ["ShardedDataParallel", "is_sharded_model"]
