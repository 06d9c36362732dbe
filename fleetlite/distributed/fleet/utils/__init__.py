"""fleet utilities: ``fused_allreduce_gradients`` (also in ``hybrid_parallel_util``)."""

from ..recompute import recompute
from .hybrid_parallel_util import fused_allreduce_gradients

__all__ = ["fused_allreduce_gradients", "recompute"]
