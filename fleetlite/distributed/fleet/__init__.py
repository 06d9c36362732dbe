"""``fleet``: Paddle's collective training facade on PyTorch.

Example::

    import torch
    from fleetlite.distributed import fleet

    strategy = fleet.DistributedStrategy()
    strategy.amp = True
    strategy.amp_configs = {"dtype": "bfloat16"}
    fleet.init(is_collective=True, strategy=strategy)
    model = fleet.distributed_model(torch.nn.Linear(8, 2))
    opt = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
    print(fleet.worker_index(), fleet.worker_num())

``fleet.util`` is Paddle's ``UtilBase`` (``all_reduce``, ``all_gather``,
``barrier``, ``get_file_shard``, ``print_on_rank``); assign your own subclass
to replace it (``fleet.util = MyUtil()``).

``fleet.amp`` holds the mixed-precision helper (:class:`~.amp.AmpHelper`,
:func:`~.amp.from_strategy`, :class:`~.amp.DistGradScaler`) that the Trainer reuses.
"""

from . import amp, base, meta_parallel, utils
from .amp import AmpHelper, DistGradScaler
from .base.topology import CommunicateTopology, HybridCommunicateGroup
from .fleet import (
    PaddleCloudRoleMaker,
    barrier_worker,
    distributed_model,
    distributed_optimizer,
    distributed_scaler,
    get_hybrid_communicate_group,
    get_parallel_plan,
    get_strategy,
    init,
    is_first_worker,
    is_initialized,
    is_server,
    is_worker,
    local_rank,
    user_strategy,
    worker_endpoints,
    worker_index,
    worker_num,
)
from .optimizer import DistributedOptimizer
from .plan import ParallelPlan
from .recompute import recompute
from .strategy import DistributedStrategy
from .util_base import UtilBase, UtilFactory

util: UtilBase = UtilBase()  # Paddle's fleet.util; a program may replace it by its own UtilBase subclass

__all__ = [
    "init",
    "distributed_model",
    "distributed_optimizer",
    "distributed_scaler",
    "get_strategy",
    "user_strategy",
    "is_initialized",
    "worker_index",
    "worker_num",
    "is_first_worker",
    "is_worker",
    "is_server",
    "util",
    "UtilBase",
    "UtilFactory",
    "barrier_worker",
    "local_rank",
    "worker_endpoints",
    "DistributedStrategy",
    "DistributedOptimizer",
    "PaddleCloudRoleMaker",
    "AmpHelper",
    "DistGradScaler",
    "amp",
    "recompute",
    "utils",
    "base",
    "meta_parallel",
    "get_hybrid_communicate_group",
    "CommunicateTopology",
    "HybridCommunicateGroup",
    "get_parallel_plan",
    "ParallelPlan",
]
