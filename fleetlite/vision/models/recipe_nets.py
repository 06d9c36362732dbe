"""CIFAR-10 networks used by the recipes: the fleet quick-start CNN, ResNet-18 (CIFAR stem) and an airbench-style net.

None of them needs torchvision. ``cifar_resnet18`` (the recipes' ``resnet18``;
``fleetlite.vision.models.resnet18`` is Paddle's ImageNet ResNet-18) keeps torchvision's parameter
names (``conv1``, ``bn1``, ``layer1.0.conv1``, ..., ``fc``), so its state dict
loads into ``torchvision.models.resnet18`` once that model's stem is given the
same 3x3 convolution and its max-pool is removed.

Example::

    import torch
    from fleetlite.vision.models import build_model

    net = build_model("tutorial_cnn", num_classes=10)
    logits = net(torch.randn(4, 3, 32, 32))      # (4, 10)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...utils.weights import load_safetensors, read_config

__all__ = ["TutorialCNN", "ResNet18", "FastNet", "tutorial_cnn", "cifar_resnet18", "fast", "build_model", "MODELS",
           "from_safetensors"]


class TutorialCNN(nn.Module):
    """The 3-conv + 2-linear network of Paddle's collective fleet quick start (``MyNet``), for 32x32 RGB input.

    Example::

        net = TutorialCNN(num_classes=10)
        assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3)
        self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.pool2 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.conv3 = nn.Conv2d(64, 64, kernel_size=3)
        self.flatten = nn.Flatten()
        self.linear1 = nn.Linear(1024, 64)
        self.linear2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(F.relu(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        x = F.relu(self.conv3(x))
        x = self.flatten(x)
        return self.linear2(F.relu(self.linear1(x)))


class _CifarBasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convolutions), torchvision's layout and names."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 images: a 3x3 stride-1 stem and no max-pool, then torchvision's four stages.

    Example::

        net = ResNet18(num_classes=10)
        assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    """

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        planes = [width, 2 * width, 4 * width, 8 * width]
        in_planes = width
        for i, (p, stride) in enumerate(zip(planes, (1, 2, 2, 2)), start=1):
            stage = nn.Sequential(_CifarBasicBlock(in_planes, p, stride), _CifarBasicBlock(p, p, 1))
            self.add_module(f"layer{i}", stage)
            in_planes = p
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class _FrozenScaleBN(nn.BatchNorm2d):
    """BatchNorm with a fixed unit scale and fast running statistics (airbench's choice)."""

    def __init__(self, num_features: int, momentum: float = 0.6, eps: float = 1e-12) -> None:
        super().__init__(num_features, eps=eps, momentum=1 - momentum)
        self.weight.requires_grad_(False)


class _ConvGroup(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, bn_momentum: float) -> None:
        conv1 = nn.Conv2d(c_in, c_out, 3, padding="same", bias=False)
        conv2 = nn.Conv2d(c_out, c_out, 3, padding="same", bias=False)
        for conv in (conv1, conv2):  # identity on the first channels: the net starts close to a shallow one
            nn.init.dirac_(conv.weight.data[: conv.weight.size(1)])
        super().__init__(conv1, nn.MaxPool2d(2), _FrozenScaleBN(c_out, bn_momentum), nn.GELU(),
                         conv2, _FrozenScaleBN(c_out, bn_momentum), nn.GELU())


class FastNet(nn.Module):
    """An airbench-style CIFAR-10 network built for speed (after Keller Jordan's airbench94).

    A 2x2 patch-whitening convolution, three conv groups (conv, max-pool,
    BatchNorm, GELU, conv, BatchNorm, GELU), a 3x3 max-pool and a scaled
    linear head. Call :meth:`init_whitening` with (normalised) training images
    before training to set the first layer to the patch-whitening transform;
    that freezes its weight (its bias still trains), as airbench does. Use it
    with ``channels_last`` and bf16 autocast on a GPU.

    Example::

        net = FastNet(num_classes=10)
        net.init_whitening(torch.randn(256, 3, 32, 32))
        assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    """

    def __init__(self, num_classes: int = 10, widths: Sequence[int] = (64, 256, 256),
                 bn_momentum: float = 0.6, scaling_factor: float = 1 / 9) -> None:
        super().__init__()
        if len(widths) != 3 or any(int(w) < 1 for w in widths):
            raise ValueError(f"FastNet widths={list(widths)} must be three positive channel counts, "
                             "e.g. [64, 256, 256]")
        whiten_width = 2 * 3 * 2 * 2  # +/- each eigenvector of the 3x2x2 patch covariance
        self.whiten = nn.Conv2d(3, whiten_width, kernel_size=2, padding=0, bias=True)
        self.act = nn.GELU()
        w1, w2, w3 = (int(w) for w in widths)
        self.layers = nn.Sequential(_ConvGroup(whiten_width, w1, bn_momentum), _ConvGroup(w1, w2, bn_momentum),
                                    _ConvGroup(w2, w3, bn_momentum))
        self.pool = nn.MaxPool2d(3)
        self.head = nn.Linear(w3, num_classes, bias=False)
        self.scaling_factor = float(scaling_factor)

    @torch.no_grad()
    def init_whitening(self, images: torch.Tensor, eps: float = 5e-4, max_images: int = 5000) -> None:
        """Set the first convolution to whiten 2x2 patches of ``images`` (float, N x 3 x 32 x 32) and freeze it.

        Every rank given the same images computes the same weights; call it
        before wrapping the model for data parallelism.
        """
        if images.dim() != 4 or images.size(1) != 3:
            raise ValueError(f"init_whitening expects float images of shape (N, 3, H, W), got {tuple(images.shape)}")
        x = images[:max_images].float().to(self.whiten.weight.device)
        c, h, w = 3, 2, 2
        patches = x.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c * h * w)
        cov = patches.T @ patches / patches.size(0)
        eigenvalues, eigenvectors = torch.linalg.eigh(cov.double())
        eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.T.flip(0).reshape(-1, c, h, w)
        scaled = eigenvectors / torch.sqrt(eigenvalues.clamp_min(0) + eps).view(-1, 1, 1, 1)
        self.whiten.weight.copy_(torch.cat((scaled, -scaled)).to(self.whiten.weight.dtype))
        self.whiten.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.act(self.whiten(x)))
        x = torch.flatten(self.pool(x), 1)
        return self.head(x) * self.scaling_factor


def tutorial_cnn(num_classes: int = 10) -> TutorialCNN:
    """The fleet quick-start CNN (3 conv + 2 linear)."""
    return TutorialCNN(num_classes=num_classes)


def cifar_resnet18(num_classes: int = 10, width: int = 64) -> ResNet18:
    """ResNet-18, CIFAR variant (3x3 stem, no max-pool): the recipes' ``resnet18`` (``build_model("resnet18")``)."""
    return ResNet18(num_classes=num_classes, width=width)


def fast(num_classes: int = 10, widths: Sequence[int] = (64, 256, 256), bn_momentum: float = 0.6,
         scaling_factor: float = 1 / 9) -> FastNet:
    """The airbench-style network (see :class:`FastNet`)."""
    return FastNet(num_classes=num_classes, widths=widths, bn_momentum=bn_momentum, scaling_factor=scaling_factor)


MODELS: dict[str, Callable[..., nn.Module]] = {"tutorial_cnn": tutorial_cnn, "resnet18": cifar_resnet18,
                                              "fast": fast}


def build_model(name: str, **kwargs) -> nn.Module:
    """Build a model by name (``tutorial_cnn``, ``resnet18``, ``fast``) with its keyword arguments."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    try:
        return MODELS[name](**kwargs)
    except TypeError as e:
        raise TypeError(f"model {name!r} does not take these arguments ({e}); "
                        f"see fleetlite.vision.models.{name}") from None


def from_safetensors(path: str, **overrides) -> nn.Module:
    """The model a recipe run exported (``model.safetensors`` + ``model.json``), weights loaded, in eval mode.

    The JSON's ``model`` entry names the network and its arguments (``num_classes`` included); keyword
    ``overrides`` replace them. Example: ``net = from_safetensors("outputs/.../model.safetensors")``.
    """
    config = read_config(path)
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict) or "name" not in config["model"]:
        raise ValueError(f"{path}: no model description alongside it (expected a JSON file next to it with "
                         "model: {name: ..., num_classes: ...}, as the recipe writes); build the network "
                         "yourself and use fleetlite.utils.weights.load_safetensors(net, path)")
    kwargs = {k: v for k, v in config["model"].items() if k not in ("name", "whiten")}
    kwargs.update(overrides)
    return load_safetensors(build_model(config["model"]["name"], **kwargs), path).eval()
