"""Paddle's ``paddle.distributed.fleet.layers.mpu``: the objects of :mod:`fleetlite.distributed.fleet.meta_parallel`.

Example::

    from fleetlite.distributed.fleet.layers.mpu import ColumnParallelLinear, mp_ops, get_rng_state_tracker
"""

from ...meta_parallel import mp_layers, mp_ops, random
from ...meta_parallel.mp_layers import (
           ColumnParallelLinear,
           ParallelCrossEntropy,
           RowParallelLinear,
           VocabParallelEmbedding,
)
from ...meta_parallel.random import RNGStatesTracker, get_rng_state_tracker, model_parallel_random_seed

__all__ = ["mp_layers", "mp_ops", "random", "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "ParallelCrossEntropy", "RNGStatesTracker", "get_rng_state_tracker", "model_parallel_random_seed"]
