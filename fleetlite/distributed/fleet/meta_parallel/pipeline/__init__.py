"""Pipeline parallelism with Paddle's names: ``LayerDesc``, ``SharedLayerDesc``, ``PipelineLayer`` (which layers
this rank builds) and ``PipelineParallel`` (``train_batch`` / ``eval_batch`` on ``torch.distributed.pipelining``).

``PipelineParallel`` is imported on first use: ``torch.distributed.pipelining`` takes about a second to import.
"""

from typing import Any

from .layers import LayerDesc, PipelineLayer, SegmentLayers, SharedLayerDesc

__all__ = ["LayerDesc", "SharedLayerDesc", "SegmentLayers", "PipelineLayer", "PipelineParallel"]


def __getattr__(name: str) -> Any:
    if name == "PipelineParallel":
        from .parallel import PipelineParallel

        return PipelineParallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
