"""Pipeline parallelism with Paddle's names: ``LayerDesc``, ``SharedLayerDesc``, ``PipelineLayer`` (which layers
this rank builds) and ``PipelineParallel`` (``train_batch`` / ``eval_batch`` on ``torch.distributed.pipelining``).

``PipelineParallel`` is imported on first use: ``torch.distributed.pipelining`` takes about a second to import.
"""

import importlib
from typing import Any

from .layers import LayerDesc, PipelineLayer, SegmentLayers, SharedLayerDesc

__all__ = ["LayerDesc", "SharedLayerDesc", "SegmentLayers", "PipelineLayer", "PipelineParallel"]


_LAZY = {"PipelineParallel": ".parallel"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
