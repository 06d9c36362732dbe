"""Paddle's ``fleet.meta_parallel``: tensor-parallel layers, the model-parallel random states and
``TensorParallel`` (what ``fleet.distributed_model`` returns with ``hybrid_configs['mp_degree'] > 1``); pipeline
parallelism: ``LayerDesc``, ``SharedLayerDesc``, ``PipelineLayer`` and ``PipelineParallel`` (``pp_degree > 1``);
segment parallelism: ``SegmentParallel`` (``sep_degree > 1``), ``split_inputs_sequence_dim`` and the all-to-all
around attention (``sequence_to_heads``, ``heads_to_sequence``, ``segment_attention``, PaddleNLP's ``ReshardLayer``).

``PipelineParallel`` is imported on first use: ``torch.distributed.pipelining`` takes about a second to import.

Example::

    from fleetlite.distributed import fleet
    s = fleet.DistributedStrategy(); s.hybrid_configs = {"mp_degree": 2}
    fleet.init(is_collective=True, strategy=s)
    head = fleet.meta_parallel.ColumnParallelLinear(64, 1000, gather_output=False)
    loss = fleet.meta_parallel.ParallelCrossEntropy()(head(x), labels).mean()
"""

import importlib
from typing import Any

from .mp_layers import ColumnParallelLinear, ParallelCrossEntropy, RowParallelLinear, VocabParallelEmbedding, is_split
from .pipeline import LayerDesc, PipelineLayer, SegmentLayers, SharedLayerDesc
from .random import RNGStatesTracker, get_rng_state_tracker, model_parallel_random_seed
from .segment_parallel import (
    ReshardLayer,
    SegmentParallel,
    heads_to_sequence,
    segment_attention,
    sequence_offset,
    sequence_to_heads,
    split_inputs_sequence_dim,
)
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
           "load_sharded_optimizer_state_dict",
           "LayerDesc", "SharedLayerDesc", "SegmentLayers", "PipelineLayer", "PipelineParallel",
           "SegmentParallel", "split_inputs_sequence_dim", "sequence_to_heads", "heads_to_sequence",
           "segment_attention", "sequence_offset", "ReshardLayer"]


#: names imported on first use, by module: torch.distributed.pipelining takes about a second to import
_LAZY = {"PipelineParallel": ".pipeline.parallel"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
