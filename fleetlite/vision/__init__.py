"""fleetlite.vision: data sets, transforms and models for image tasks (Paddle's ``paddle.vision`` layout).

``datasets`` (Paddle's MNIST, FashionMNIST, Cifar10, Cifar100 readers and a
synthetic CIFAR-10), ``models`` (Paddle's LeNet, ResNet, VGG, MobileNet names
on torchvision's networks, and the recipe networks), ``transforms``, and
Paddle's ``set_image_backend`` / ``get_image_backend``. Submodules load on
first use; importing ``fleetlite.vision`` imports neither torchvision nor the
submodules.

Example::

    from fleetlite.vision.datasets import SyntheticCifar10
    images, labels = SyntheticCifar10(size=100).as_tensors()
"""

from __future__ import annotations

import importlib

from .image import get_image_backend, set_image_backend

_SUBMODULES = ("datasets", "transforms", "models")

__all__ = [*_SUBMODULES, "get_image_backend", "set_image_backend"]


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'fleetlite.vision' has no attribute {name!r}")


def __dir__():
    return __all__
