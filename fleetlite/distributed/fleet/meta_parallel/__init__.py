"""Paddle's ``fleet.meta_parallel``: model-parallel layers and wrappers (pipeline parallelism here)."""

from typing import Any

from .pipeline import LayerDesc, PipelineLayer, SegmentLayers, SharedLayerDesc

__all__ = ["LayerDesc", "SharedLayerDesc", "SegmentLayers", "PipelineLayer", "PipelineParallel"]


def __getattr__(name: str) -> Any:
    if name == "PipelineParallel":  # torch.distributed.pipelining is imported on first use (about a second)
        from .pipeline.parallel import PipelineParallel

        return PipelineParallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
