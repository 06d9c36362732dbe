"""Paddle's ``fleet.meta_parallel``: model-parallel layers and wrappers (pipeline parallelism here)."""

from .pipeline import LayerDesc, PipelineLayer, PipelineParallel, SegmentLayers, SharedLayerDesc

__all__ = ["LayerDesc", "SharedLayerDesc", "SegmentLayers", "PipelineLayer", "PipelineParallel"]
