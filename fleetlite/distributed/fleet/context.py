"""What ``fleet.init`` keeps: the strategy, its parallel plan, the role maker, and the models and optimizers
wrapped since.

One object for the process, written by :mod:`.fleet` (``init``,
``distributed_model``, ``distributed_optimizer``) and read by the modules
beside it (``amp.from_strategy`` with no strategy uses the kept one), so
they need not import the facade that imports them.

Example::

    from fleetlite.distributed.fleet.context import get_strategy
    strategy = get_strategy()   # a copy: the defaults before fleet.init
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

from .strategy import DistributedStrategy

__all__ = ["FleetState", "state", "get_strategy", "reset"]


class FleetState:
    """The strategy ``fleet.init`` kept (None before), its parallel plan, its role maker, and the wrapped models and
    optimizers.

    Example::

        from fleetlite.distributed.fleet.context import state
        state.strategy is None   # True before fleet.init
    """

    def __init__(self) -> None:
        self.strategy: DistributedStrategy | None = None
        # The strategy the user last gave fleet.init or distributed_optimizer (None before): a Trainer's own
        # fleet.init replaces ``strategy`` but never this, so every Trainer built without a strategy takes it
        # (Note [trainer strategy]).
        self.user_strategy: DistributedStrategy | None = None
        self.role_maker: Any = None  # a fleet.PaddleCloudRoleMaker
        self.models: weakref.WeakSet[Any] = weakref.WeakSet()
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()  # fleet.DistributedOptimizer objects
        # the ParallelPlan of fleet.init (plan.py): the one place degrees, the mesh and the groups live
        self.plan: Any = None

    @property
    def hcg(self) -> Any:
        """The HybridCommunicateGroup over :attr:`plan` (base/topology.py); None until the plan is built."""
        return self.plan._view if self.plan is not None else None


#: The one state of this process (never replaced: :func:`reset` clears it in place).
state = FleetState()


def get_strategy() -> DistributedStrategy:
    """A copy of the strategy kept by ``fleet.init`` (the defaults before ``init``)."""
    return copy.deepcopy(state.strategy) if state.strategy is not None else DistributedStrategy()


def reset() -> None:
    """Forget the strategy, models and optimizers (tests)."""
    state.__init__()
