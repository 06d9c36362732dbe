"""The ``Example::`` blocks of fleetlite.vision's public data classes and transforms run as written."""

import inspect
import textwrap

import pytest
import torch

from fleetlite.vision.datasets import ImageArrayDataset, SyntheticCifar10
from fleetlite.vision.transforms import crop_flip


def example(obj) -> str:
    block = inspect.getdoc(obj).split("Example::", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if line.strip() and not line.startswith(" "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


@pytest.mark.parametrize("obj", [ImageArrayDataset, SyntheticCifar10, crop_flip])
def test_example_runs(obj):
    scope = {"torch": torch, "ImageArrayDataset": ImageArrayDataset, "crop_flip": crop_flip}
    exec(compile(example(obj), f"<{obj.__name__} example>", "exec"), scope)




@pytest.mark.parametrize("name", ["LeNet", "AlexNet", "ResNet", "VGG", "MobileNetV1", "MobileNetV2",
                                  "MobileNetV3Small", "MobileNetV3Large", "SqueezeNet", "DenseNet", "ShuffleNetV2",
                                  "GoogLeNet", "InceptionV3",
                                  "set_image_backend", "Normalize", "Transpose"])
def test_paddle_face_examples_run(name):
    pytest.importorskip("torchvision")
    import fleetlite.vision as vision
    from fleetlite.vision import image, models, transforms
    from fleetlite.vision.models import densenet, inceptionv3, resnet, vgg

    obj = {"VGG": vgg.VGG, "set_image_backend": image, "Normalize": transforms.Normalize,
           "Transpose": transforms.Transpose}.get(name) or getattr(models, name)
    scope = {"torch": torch, **vars(resnet), **vars(vgg), **vars(densenet), **vars(inceptionv3),
             **{k: getattr(models, k) for k in models.__all__},
             "vision": vision, "Normalize": transforms.Normalize, "Transpose": transforms.Transpose}
    exec(compile(example(obj), f"<{name} example>", "exec"), scope)
