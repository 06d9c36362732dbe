"""fleetlite.nn: layers that need the distributed environment (Paddle's ``paddle.nn`` names).

Example::

    import torch.nn as nn
    from fleetlite.nn import SyncBatchNorm
    model = SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
"""

from .sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm"]
