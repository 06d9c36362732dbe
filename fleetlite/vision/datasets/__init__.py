"""Image data sets: Paddle's readers of the real files (CIFAR-10/100, MNIST, Fashion-MNIST, image folders) and
a synthetic, offline CIFAR-10 stand-in.

The readers keep Paddle's names, arguments and item types (``paddle.vision.datasets``); nothing is downloaded
unless a file is missing and ``download=True``.

Example::

    from fleetlite.vision.datasets import Cifar10, SyntheticCifar10
    train = SyntheticCifar10(mode="train", size=2000)      # offline; Cifar10(mode="train") for the real data
    images, labels = train.as_tensors()
"""

from ._common import DatasetError
from .base import ImageArrayDataset
from .cifar import Cifar10, Cifar100
from .folder import DatasetFolder, ImageFolder
from .mnist import MNIST, FashionMNIST
from .synthetic import SYNTHETIC_CLASSES, SyntheticCifar10

__all__ = ["Cifar10", "Cifar100", "MNIST", "FashionMNIST", "DatasetFolder", "ImageFolder", "SyntheticCifar10",
           "DatasetError", "ImageArrayDataset", "SYNTHETIC_CLASSES"]
