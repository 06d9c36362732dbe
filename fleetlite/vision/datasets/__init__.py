"""Image data sets: the real CIFAR-10 reader and a synthetic, offline stand-in with the same interfaces.

Example::

    from fleetlite.vision.datasets import Cifar10, SyntheticCifar10
    train = SyntheticCifar10(mode="train", size=2000)      # offline; Cifar10(mode="train") for the real data
    images, labels = train.as_tensors()
"""

from .base import ImageArrayDataset
from .cifar import Cifar10, DatasetError
from .synthetic import SYNTHETIC_CLASSES, SyntheticCifar10

__all__ = ["Cifar10", "SyntheticCifar10", "DatasetError", "ImageArrayDataset", "SYNTHETIC_CLASSES"]
