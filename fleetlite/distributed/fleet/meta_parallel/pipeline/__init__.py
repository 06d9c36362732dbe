"""Pipeline parallelism with Paddle's names: ``LayerDesc``, ``SharedLayerDesc``, ``PipelineLayer`` (which layers
this rank builds) and ``PipelineParallel`` (``train_batch`` / ``eval_batch`` on ``torch.distributed.pipelining``)."""

from .layers import LayerDesc, PipelineLayer, SegmentLayers, SharedLayerDesc
from .parallel import PipelineParallel

__all__ = ["LayerDesc", "SharedLayerDesc", "SegmentLayers", "PipelineLayer", "PipelineParallel"]
