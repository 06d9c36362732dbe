"""fleetlite.vision: data sets, transforms and models for image tasks (Paddle's ``paddle.vision`` layout).

Submodules load on first use; importing ``fleetlite.vision`` imports neither
torchvision nor the submodules.

Example::

    from fleetlite.vision.datasets import SyntheticCifar10
    images, labels = SyntheticCifar10(size=100).as_tensors()
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("datasets", "transforms", "models")

__all__ = list(_SUBMODULES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'fleetlite.vision' has no attribute {name!r}")


def __dir__():
    return __all__
