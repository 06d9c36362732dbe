"""fleetlite.vision: data sets, transforms and models for image tasks (Paddle's ``paddle.vision`` layout).

``datasets`` (Paddle's MNIST, FashionMNIST, Cifar10, Cifar100 readers and a
synthetic CIFAR-10), ``models`` (Paddle's LeNet, AlexNet, ResNet, VGG, MobileNet
names on torchvision's networks, and the recipe networks), ``transforms``,
Paddle's ``set_image_backend`` / ``get_image_backend`` / ``image_load``, and the
data set, model and transform names Paddle re-exports (``fleetlite.vision.MNIST``). Submodules load on
first use; importing ``fleetlite.vision`` imports neither torchvision nor the
submodules.

Example::

    from fleetlite.vision.datasets import SyntheticCifar10
    images, labels = SyntheticCifar10(size=100).as_tensors()
"""

from __future__ import annotations

import importlib

from .image import get_image_backend, image_load, set_image_backend

_SUBMODULES = ("datasets", "transforms", "models")

# the names Paddle's ``paddle.vision`` re-exports from its submodules (loaded on first use)
_REEXPORTS = {
    **dict.fromkeys(["DatasetFolder", "ImageFolder", "MNIST", "FashionMNIST", "Cifar10", "Cifar100"], "datasets"),
    **dict.fromkeys(["ResNet", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "MobileNetV1",
                     "mobilenet_v1", "MobileNetV2", "mobilenet_v2", "VGG", "vgg11", "vgg13", "vgg16", "vgg19",
                     "DenseNet", "densenet121", "densenet161", "densenet169", "densenet201", "LeNet", "AlexNet",
                     "alexnet"], "models"),
    **dict.fromkeys(["Normalize", "Transpose"], "transforms"),
}

__all__ = [*_SUBMODULES, "get_image_backend", "set_image_backend", "image_load", *_REEXPORTS]


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    if name in _REEXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_REEXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fleetlite.vision' has no attribute {name!r}")


def __dir__():
    return __all__
