"""Image classification networks: Paddle's ``paddle.vision.models`` names and the recipes' CIFAR-10 networks.

Paddle's models keep Paddle's constructors, positional order and defaults
(``LeNet(num_classes=10)``, ``ResNet(block, depth=50, width=64,
num_classes=1000, with_pool=True, groups=1)``, ``resnet50(pretrained=False,
**kwargs)``, ``vgg16(pretrained=False, batch_norm=False, **kwargs)``,
``mobilenet_v2(pretrained=False, scale=1.0, **kwargs)``, ...). Where the
architecture is torchvision's, the model *is* torchvision's (a thin subclass),
so its parameter names are torchvision's and ``torchvision.models`` weights
load into it. ``num_classes <= 0`` drops the classifier and
``with_pool=False`` the global pooling, as in Paddle. ``pretrained=True``
cannot download weights here: it raises an error saying how to load a file.

Importing this package imports neither torchvision nor Paddle's model modules:
``LeNet``, ``AlexNet``, ``GoogLeNet``, ``MobileNetV1``, ``MobileNetV3Small/Large``, ``SqueezeNet``, ``ShuffleNetV2``
and the recipe networks need only torch; the others
load torchvision on first use.

Example::

    import torch
    from fleetlite.vision.models import LeNet, resnet50

    assert LeNet()(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    net = resnet50(num_classes=10)                        # Paddle: paddle.vision.models.resnet50(num_classes=10)
"""

from __future__ import annotations

import importlib

from .alexnet import AlexNet, alexnet
from .googlenet import GoogLeNet, googlenet
from .lenet import LeNet
from .mobilenetv1 import MobileNetV1, mobilenet_v1
from .mobilenetv3 import MobileNetV3Large, MobileNetV3Small, mobilenet_v3_large, mobilenet_v3_small
from .recipe_nets import (
    MODELS,
    FastNet,
    ResNet18,
    TutorialCNN,
    build_model,
    cifar_resnet18,
    fast,
    from_safetensors,
    tutorial_cnn,
)
from .shufflenetv2 import (
    ShuffleNetV2,
    shufflenet_v2_swish,
    shufflenet_v2_x0_5,
    shufflenet_v2_x0_25,
    shufflenet_v2_x0_33,
    shufflenet_v2_x1_0,
    shufflenet_v2_x1_5,
    shufflenet_v2_x2_0,
)
from .squeezenet import SqueezeNet, squeezenet1_0, squeezenet1_1

# Paddle's names that live on torchvision's implementations: loaded (with torchvision) on first use
_LAZY = {
    **dict.fromkeys(["ResNet", "BasicBlock", "BottleneckBlock", "resnet18", "resnet34", "resnet50", "resnet101",
                     "resnet152", "resnext50_32x4d", "resnext50_64x4d", "resnext101_32x4d", "resnext101_64x4d",
                     "resnext152_32x4d", "resnext152_64x4d", "wide_resnet50_2", "wide_resnet101_2"], "resnet"),
    **dict.fromkeys(["VGG", "vgg11", "vgg13", "vgg16", "vgg19"], "vgg"),
    **dict.fromkeys(["MobileNetV2", "mobilenet_v2"], "mobilenetv2"),
    **dict.fromkeys(["InceptionV3", "inception_v3"], "inceptionv3"),
    **dict.fromkeys(["DenseNet", "densenet121", "densenet161", "densenet169", "densenet201", "densenet264"],
                    "densenet"),
}

__all__ = ["LeNet", "AlexNet", "alexnet", "GoogLeNet", "googlenet", "MobileNetV1", "mobilenet_v1",
           "MobileNetV3Small", "MobileNetV3Large",
           "mobilenet_v3_small", "mobilenet_v3_large", "SqueezeNet",
           "squeezenet1_0", "squeezenet1_1", "ShuffleNetV2", "shufflenet_v2_x0_25", "shufflenet_v2_x0_33",
           "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0",
           "shufflenet_v2_swish",
           *_LAZY,
           "TutorialCNN", "ResNet18", "FastNet", "tutorial_cnn", "cifar_resnet18", "fast", "build_model", "MODELS",
           "from_safetensors"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fleetlite.vision.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
