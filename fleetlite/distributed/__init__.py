"""fleetlite.distributed: environment, process group, spawn and launch (Paddle names, torch underneath).

Example::

    import fleetlite.distributed as dist
    dist.init_parallel_env()
    print(dist.get_rank(), dist.get_world_size(), dist.ParallelEnv().device)
"""

import importlib

from .agreement import RankMismatchError
from .collective import (
    CollectiveError,
    ParallelEnv,
    ReduceOp,
    all_gather_object,
    all_reduce,
    barrier,
    broadcast,
    default_timeout,
    destroy_process_group,
    get_rank,
    get_world_size,
    init_parallel_env,
    is_initialized,
)
from .env import DistEnvError, read_env
from .spawn import SpawnError, spawn

__all__ = [
    "init_parallel_env",
    "get_rank",
    "get_world_size",
    "barrier",
    "is_initialized",
    "default_timeout",
    "destroy_process_group",
    "all_reduce",
    "broadcast",
    "all_gather_object",
    "ReduceOp",
    "CollectiveError",
    "ParallelEnv",
    "DistEnvError",
    "RankMismatchError",
    "read_env",
    "spawn",
    "SpawnError",
    "fleet",
]


def __getattr__(name):
    if name == "fleet":  # Paddle's path puts the facade (a higher layer: it pulls in the engine) in here: loaded on use
        return importlib.import_module(f"{__name__}.fleet")
    raise AttributeError(f"module 'fleetlite.distributed' has no attribute {name!r}")
