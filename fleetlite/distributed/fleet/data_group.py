"""The data group: the ranks a training's data is split over, and its process group (Note [data group]).

# Note [data group]
Under hybrid parallelism the ranks of one tensor-parallel group compute one model replica together, and
so do the stages of one pipeline: they must read the SAME batches. Data is therefore split over the
data-parallel axes only. The rule, in this one place: the data group is the plan's ``data`` group, dp × sharding
(rank = ``plan.data_rank``, hcg's ``get_data_sharding_parallel_rank()``, size = dp × sharding degree: the
sharding axis splits data as dp does, Note [sharding with mp and pp]); when that is every rank (no ``mp_degree``,
``pp_degree`` or ``sep_degree`` above 1) it is the world, torch's default group. Everything the Trainer
splits or sums over data uses it: its samplers (explicit ``num_replicas`` / ``rank``), the loss and metric
sums of fit and evaluate (one all-reduce over the group; a torchmetrics metric's ``process_group``), the
gathering of predictions. ``DistributedBatchSampler()``'s own default stays Paddle's (the world): in a
hand-written hybrid program pass ``num_replicas=hcg.get_data_parallel_world_size(),
rank=hcg.get_data_parallel_rank()``, as Paddle's hybrid examples do (with sharding,
``get_data_sharding_parallel_world_size()`` / ``get_data_sharding_parallel_rank()``).

Example::

    from fleetlite.distributed.fleet.data_group import data_group
    g = data_group()          # after fleet.init; DataGroup(rank=0, size=1, group=None, hybrid=False) alone
    sampler = DistributedBatchSampler(dataset, 32, num_replicas=g.size, rank=g.rank)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import collective
from . import context

__all__ = ["DataGroup", "data_group"]


@dataclass(frozen=True)
class DataGroup:
    """This rank's place in the data group: ``rank`` of ``size``; ``group`` the torch process group (None: the
    world, or no process group at all); ``hybrid``: the group is the hybrid topology's data-parallel group.

    Example::

        g = DataGroup(rank=0, size=1, group=None, hybrid=False)
        g.sharded   # False: every rank of the group reads all the data
    """

    rank: int
    size: int
    group: Any = None
    hybrid: bool = False

    @property
    def sharded(self) -> bool:
        """Whether the data is split (more than one rank in the group)."""
        return self.size > 1


def data_group() -> DataGroup:
    """The data group of this process now (Note [data group]); the world before ``fleet.init``.

    Example::

        g = data_group()
        collective.all_reduce(sums, group=g.group)   # sums over the ranks that read different data
    """
    plan = context.state.plan if context.state.strategy is not None else None
    if plan is None or not plan.built or plan.data_size == plan.world_size:  # dp x sharding is every rank: the world
        return DataGroup(collective.get_rank(), collective.get_world_size(), None, False)
    return DataGroup(plan.data_rank, plan.data_size, plan.group("data"), True)  # (fleet.init built this plan)
