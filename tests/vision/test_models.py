"""The recipe models against references: the quick-start MyNet, torchvision's ResNet-18, whitening maths."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fleetlite.vision.models import FastNet, ResNet18, TutorialCNN, build_model


def _quick_start_mynet(examples_dir: Path):
    """The MyNet class of the ported fleet quick start, taken from the example's source."""
    example = examples_dir / "fleet_cifar10.py"
    tree = ast.parse(example.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MyNet")
    ns: dict = {"torch": torch, "nn": nn, "F": torch.nn.functional}
    exec(compile(ast.Module([cls], []), str(example), "exec"), ns)
    return ns["MyNet"]


def test_tutorial_cnn_is_the_quick_start_network(examples_dir):
    torch.manual_seed(0)
    ref = _quick_start_mynet(examples_dir)(num_classes=10)
    ours = TutorialCNN(num_classes=10)
    assert [(k, v.shape) for k, v in ours.state_dict().items()] == [(k, v.shape) for k, v in ref.state_dict().items()]
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(ours(x), ref(x))


def _torchvision_cifar_resnet18(num_classes):
    torchvision = pytest.importorskip("torchvision")
    ref = torchvision.models.resnet18(num_classes=num_classes)
    ref.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    ref.maxpool = nn.Identity()
    return ref


def test_resnet18_matches_torchvision_with_cifar_stem():
    torch.manual_seed(0)
    ours = ResNet18(num_classes=10)
    ref = _torchvision_cifar_resnet18(10)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    ref.load_state_dict(ours.state_dict())
    ours.eval()
    ref.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x))
    ours.train()
    ref.train()
    torch.testing.assert_close(ours(x), ref(x))  # batch statistics too


def test_fast_net_shapes_and_trainable_parameters():
    net = FastNet(num_classes=10, widths=(8, 16, 16))
    out = net(torch.randn(3, 3, 32, 32))
    assert out.shape == (3, 10)
    out.sum().backward()
    assert net.whiten.weight.grad is not None and net.head.weight.grad is not None
    frozen = [n for n, p in net.named_parameters() if not p.requires_grad]
    assert frozen and all(n.endswith(".weight") for n in frozen)  # the BatchNorm scales


def test_fast_net_conv_groups_start_as_identity_on_leading_channels():
    net = FastNet(widths=(32, 32, 32))
    conv = net.layers[1][0]
    x = torch.randn(1, 32, 8, 8)
    torch.testing.assert_close(conv(x), x)


def test_fast_net_whitening_decorrelates_patches():
    torch.manual_seed(0)
    base = torch.randn(512, 1, 32, 32)
    images = torch.cat([base, 0.8 * base + 0.2 * torch.randn_like(base), torch.randn_like(base)], dim=1)
    images = torch.nn.functional.avg_pool2d(images, 3, stride=1, padding=1)  # correlate neighbouring pixels
    net = FastNet(widths=(8, 8, 8))
    net.init_whitening(images, eps=1e-8)
    assert not net.whiten.weight.requires_grad and net.whiten.bias.requires_grad
    with torch.no_grad():
        y = torch.nn.functional.conv2d(images, net.whiten.weight[:12])  # the + half, no bias
    feats = y.permute(0, 2, 3, 1).reshape(-1, 12).double()
    cov = feats.T @ feats / feats.size(0)
    torch.testing.assert_close(cov, torch.eye(12, dtype=torch.double), atol=2e-3, rtol=0)
    torch.testing.assert_close(net.whiten.weight[12:], -net.whiten.weight[:12])


def test_fast_net_bf16_autocast_on_cpu():
    net = FastNet(widths=(8, 16, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last))
    assert out.shape == (2, 10)


def test_build_model_names_and_errors():
    assert isinstance(build_model("resnet18", num_classes=5), ResNet18)
    assert build_model("tutorial_cnn", num_classes=7)(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    with pytest.raises(ValueError, match="unknown model 'vgg'.*fast, resnet18, tutorial_cnn"):
        build_model("vgg")
    with pytest.raises(TypeError, match="model 'tutorial_cnn' does not take"):
        build_model("tutorial_cnn", widths=[1, 2, 3])
    with pytest.raises(ValueError, match="three positive channel counts"):
        FastNet(widths=(8, 8))


def test_importing_models_does_not_import_torchvision():
    code = "import sys, fleetlite.vision.models; assert 'torchvision' not in sys.modules, 'torchvision imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
