"""Paddle's ``fleet.meta_parallel``: tensor-parallel layers, the model-parallel random states and
``TensorParallel`` (what ``fleet.distributed_model`` returns with ``hybrid_configs['mp_degree'] > 1``).

Example::

    from fleetlite.distributed import fleet
    s = fleet.DistributedStrategy(); s.hybrid_configs = {"mp_degree": 2}
    fleet.init(is_collective=True, strategy=s)
    head = fleet.meta_parallel.ColumnParallelLinear(64, 1000, gather_output=False)
    loss = fleet.meta_parallel.ParallelCrossEntropy()(head(x), labels).mean()
"""

from .mp_layers import ColumnParallelLinear, ParallelCrossEntropy, RowParallelLinear, VocabParallelEmbedding, is_split
from .random import RNGStatesTracker, get_rng_state_tracker, model_parallel_random_seed
from .sharded_state import (
    load_sharded_optimizer_state_dict,
    load_sharded_state_dict,
    sharded_optimizer_state_dict,
    sharded_state_dict,
)
from .tensor_parallel import TensorParallel

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelCrossEntropy",
           "get_rng_state_tracker", "model_parallel_random_seed", "RNGStatesTracker", "TensorParallel", "is_split",
           "sharded_state_dict", "load_sharded_state_dict", "sharded_optimizer_state_dict",
           "load_sharded_optimizer_state_dict"]
