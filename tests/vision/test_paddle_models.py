"""Paddle's ``paddle.vision.models`` names against references: Paddle's documented shapes and parameter counts,
torchvision's same architectures (parameter names, counts, outputs), Paddle's signatures."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import torch

from fleetlite.vision import models

tv = pytest.importorskip("torchvision.models")


def n_params(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def test_lenet_is_paddles_network():
    net = models.LeNet()
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert n_params(net) == 61_610  # paddle.summary(LeNet()) in Paddle's docs: "Total params: 61,610"
    assert [k for k in net.state_dict()] == ["features.0.weight", "features.0.bias", "features.3.weight",
                                             "features.3.bias", "fc.0.weight", "fc.0.bias", "fc.1.weight",
                                             "fc.1.bias", "fc.2.weight", "fc.2.bias"]
    assert models.LeNet(num_classes=5)(torch.randn(1, 1, 28, 28)).shape == (1, 5)
    headless = models.LeNet(num_classes=0)
    assert not hasattr(headless, "fc") and headless(torch.randn(3, 1, 28, 28)).shape == (3, 16, 5, 5)


@pytest.mark.parametrize("paddle_name, tv_name, count", [
    ("resnet18", "resnet18", 11_689_512), ("resnet34", "resnet34", 21_797_672),
    ("resnet50", "resnet50", 25_557_032), ("resnet101", "resnet101", 44_549_160),
    ("resnext50_32x4d", "resnext50_32x4d", 25_028_904), ("wide_resnet50_2", "wide_resnet50_2", 68_883_240),
    ("vgg16", "vgg16", 138_357_544), ("mobilenet_v2", "mobilenet_v2", 3_504_872),
])
def test_same_architecture_as_torchvision(paddle_name, tv_name, count):
    ours, ref = getattr(models, paddle_name)(), getattr(tv, tv_name)()
    assert n_params(ours) == n_params(ref) == count
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    ours.load_state_dict(ref.state_dict())  # torchvision's weights load as they are
    ours.eval()
    ref.eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x))


def test_resnet_class_as_paddle_calls_it():
    net = models.ResNet(models.BottleneckBlock, 50)
    assert n_params(net) == 25_557_032  # Paddle's resnet50: 25.56M
    assert net(torch.randn(1, 3, 224, 224)).shape == (1, 1000)  # Paddle's docstring: [1, 1000]
    assert n_params(models.ResNet(models.BasicBlock, 18)) == 11_689_512
    assert n_params(models.ResNet(models.BottleneckBlock, 50, width=4, groups=32)) == 25_028_904  # ResNeXt
    assert n_params(models.ResNet(models.BottleneckBlock, 50, width=128)) == 68_883_240  # wide
    feats = models.ResNet(models.BasicBlock, 18, num_classes=0, with_pool=False)
    assert not hasattr(feats, "fc") and not hasattr(feats, "avgpool")
    assert feats(torch.randn(2, 3, 64, 64)).shape == (2, 512, 2, 2)
    pooled = models.resnet50(num_classes=-1)
    assert pooled(torch.randn(2, 3, 64, 64)).shape == (2, 2048, 1, 1)  # Paddle: pooled, not flattened
    assert models.resnet18(num_classes=10)(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="depth=20 is not one of"):
        models.ResNet(models.BasicBlock, 20)


def test_vgg_as_paddle_calls_it():
    from fleetlite.vision.models.vgg import cfgs, make_layers

    net = models.vgg11(batch_norm=True, num_classes=10)
    assert n_params(net) == n_params(tv.vgg11_bn(num_classes=10))
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    feats = models.VGG(make_layers(cfgs["A"]), num_classes=0, with_pool=False)
    assert feats(torch.randn(1, 3, 64, 64)).shape == (1, 512, 2, 2)
    assert models.VGG(make_layers(cfgs["A"]), num_classes=0)(torch.randn(1, 3, 64, 64)).shape == (1, 512, 7, 7)


def test_mobilenets():
    v1 = models.mobilenet_v1()
    assert n_params(v1) == 4_231_976  # the MobileNet paper's 4.2M; by hand below
    conv_bn = lambda c_in, c_out, k, g=1: c_in // g * c_out * k * k + 2 * c_out  # noqa: E731
    blocks = [(32, 64, 1), (64, 128, 1), (128, 128, 1), (128, 256, 1), (256, 256, 1), (256, 512, 1)] + \
        [(512, 512, 1)] * 5 + [(512, 1024, 1), (1024, 1024, 1)]
    by_hand = conv_bn(3, 32, 3) + sum(conv_bn(a, a, 3, a) + conv_bn(a, b, 1) for a, b, _ in blocks) + 1024 * 1000 + 1000
    assert by_hand == 4_231_976
    assert v1(torch.randn(1, 3, 224, 224)).shape == (1, 1000)
    assert "conv5_6._pointwise_conv.0.weight" in v1.state_dict()
    assert models.mobilenet_v1(scale=0.5, num_classes=0)(torch.randn(1, 3, 64, 64)).shape == (1, 512, 1, 1)
    v2 = models.mobilenet_v2(scale=0.5, num_classes=10)
    assert n_params(v2) == n_params(tv.mobilenet_v2(width_mult=0.5, num_classes=10))
    assert v2(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    assert models.MobileNetV2(num_classes=0, with_pool=False)(torch.randn(1, 3, 64, 64)).shape == (1, 1280, 2, 2)


@pytest.mark.parametrize("name, params", [
    ("LeNet", ["num_classes=10"]),
    ("ResNet", ["block", "depth=50", "width=64", "num_classes=1000", "with_pool=True", "groups=1"]),
    ("BottleneckBlock", ["inplanes", "planes", "stride=1", "downsample=None", "groups=1", "base_width=64",
                         "dilation=1", "norm_layer=None"]),
    ("resnet50", ["pretrained=False", "**kwargs"]),
    ("vgg16", ["pretrained=False", "batch_norm=False", "**kwargs"]),
    ("VGG", ["features", "num_classes=1000", "with_pool=True"]),
    ("mobilenet_v1", ["pretrained=False", "scale=1.0", "**kwargs"]),
    ("mobilenet_v2", ["pretrained=False", "scale=1.0", "**kwargs"]),
    ("MobileNetV1", ["scale=1.0", "num_classes=1000", "with_pool=True"]),
    ("MobileNetV2", ["scale=1.0", "num_classes=1000", "with_pool=True"]),
])
def test_paddle_signatures(name, params):
    sig = inspect.signature(getattr(models, name))
    got = [str(p).split(":")[0] + (f"={p.default!r}" if p.default is not p.empty else "")
           if p.kind is not p.VAR_KEYWORD else f"**{p.name}" for p in sig.parameters.values()]
    assert got == params


def test_pretrained_is_refused_with_the_way_to_load_weights():
    with pytest.raises(RuntimeError, match=r"resnet50\(pretrained=True\): fleetlite does not download.*"
                                           r"load_state_dict\(torch.load\(PATH.*torchvision.models.resnet50"):
        models.resnet50(pretrained=True)
    with pytest.raises(RuntimeError, match=r"vgg16_bn\(pretrained=True\)"):
        models.vgg16(True, True)
    with pytest.raises(RuntimeError, match="does not download"):
        models.mobilenet_v1(pretrained=True)


def test_importing_paddle_models_package_is_light():
    code = ("import sys, fleetlite.vision.models as m; m.LeNet(); m.mobilenet_v1(scale=0.25); "
            "assert 'torchvision' not in sys.modules; m.resnet18; assert 'torchvision' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_alexnet_has_torchvisions_sizes_and_paddles_dropout():
    net = models.alexnet()
    assert n_params(net) == n_params(tv.alexnet()) == 61_100_840
    assert "_conv1._conv.weight" in net.state_dict() and "_fc8.bias" in net.state_dict()
    x = torch.randn(2, 3, 224, 224)
    assert net(x).shape == (2, 1000) and models.AlexNet(num_classes=0)(x).shape == (2, 256, 6, 6)
    # the same network as torchvision's up to Paddle's dropout: with weights copied across, eval logits match
    # torchvision's once each dropout's eval factor (1 - p = 0.5) is applied to its input as Paddle does
    ref = tv.alexnet().eval()
    ours = models.alexnet().eval()
    convs = [ours._conv1._conv, ours._conv2._conv, ours._conv3, ours._conv4, ours._conv5._conv]
    for mine, theirs in zip(convs, [ref.features[i] for i in (0, 3, 6, 8, 10)]):
        mine.load_state_dict(theirs.state_dict())
    for mine, theirs in zip([ours._fc6, ours._fc7, ours._fc8], [ref.classifier[i] for i in (1, 4, 6)]):
        mine.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        feats = torch.flatten(ref.avgpool(ref.features(x[:1])), 1)
        h = torch.relu(ref.classifier[1](feats * 0.5))
        want = ref.classifier[6](torch.relu(ref.classifier[4](h * 0.5)))
        torch.testing.assert_close(ours(x[:1]), want)
    drop = models.alexnet().train()._drop1
    torch.manual_seed(0)
    y = drop(torch.ones(10_000))
    assert set(y.unique().tolist()) == {0.0, 1.0}  # Paddle's downscale_in_infer: kept values are not rescaled


def test_paddle_vision_top_level_names():
    import fleetlite.vision as vision
    from fleetlite.vision import datasets, transforms

    assert vision.resnet50 is models.resnet50 and vision.LeNet is models.LeNet and vision.VGG is models.VGG
    assert vision.MNIST is datasets.MNIST and vision.Cifar100 is datasets.Cifar100
    assert vision.Normalize is transforms.Normalize
    assert vision.densenet121 is models.densenet121
    with pytest.raises(AttributeError, match="has no attribute 'densenet264'"):  # not re-exported by Paddle
        vision.densenet264  # noqa: B018


def test_image_load(tmp_path):
    import numpy as np
    from PIL import Image

    from fleetlite.vision import image_load

    Image.fromarray(np.zeros((4, 5, 3), np.uint8)).save(tmp_path / "a.png")
    assert image_load(tmp_path / "a.png").size == (5, 4)
    with pytest.raises(ValueError, match="one of"):
        image_load(tmp_path / "a.png", backend="tensor")


def test_mobilenet_v3_is_paddles_not_torchvisions():
    small, large = models.mobilenet_v3_small(), models.mobilenet_v3_large()
    # PaddleClas' model table: 2.94M and 5.47M parameters (rounded; its counts are approximate: it gives 3.44M for
    # MobileNetV2, whose exact count is 3.50M), so within 0.5%
    assert n_params(small) == pytest.approx(2.94e6, rel=5e-3) and n_params(large) == pytest.approx(5.47e6, rel=5e-3)
    assert n_params(small) != n_params(tv.mobilenet_v3_small())  # torchvision's head and SE differ
    sd = small.state_dict()
    assert sd["last_conv.weight"].shape == (1280, 576, 1, 1) and "last_conv.bias" not in sd  # Paddle's head
    assert sd["blocks.0.mid_se.conv1.weight"].shape == (4, 16, 1, 1)  # SE: channels // 4
    assert small(torch.randn(2, 3, 224, 224)).shape == (2, 1000)
    assert models.MobileNetV3Large(scale=0.5, num_classes=0, with_pool=False)(torch.randn(1, 3, 64, 64)).shape == \
        (1, 480, 2, 2)
    se = small.blocks[0].mid_se
    x = torch.randn(1, 16, 4, 4)
    with torch.no_grad():
        s = se.conv2(se.relu(se.conv1(se.avg_pool(x))))
        torch.testing.assert_close(se(x), x * torch.clamp(s / 5 + 0.5, 0, 1))  # Paddle's hardsigmoid slope 0.2


@pytest.mark.parametrize("version, builder, tv_builder", [("1.0", "squeezenet1_0", "squeezenet1_0"),
                                                          ("1.1", "squeezenet1_1", "squeezenet1_1")])
def test_squeezenet_is_paddles(version, builder, tv_builder):
    net = getattr(models, builder)()
    assert net.version == version and n_params(net) == n_params(getattr(tv, tv_builder)())  # same layer sizes
    assert "_conv8._conv_path2._conv.weight" in net.state_dict() and "_conv9.bias" in net.state_dict()
    assert net(torch.randn(1, 3, 224, 224)).shape == (1, 1000)
    # Paddle's max-pools floor (torchvision's use ceil_mode): a 1.0 net maps 224 to 12x12 features, not 13x13
    feats = models.SqueezeNet(version, num_classes=0, with_pool=False)
    assert feats(torch.randn(1, 3, 224, 224)).shape == ((1, 512, 12, 12) if version == "1.0" else (1, 512, 13, 13))
    assert getattr(tv, tv_builder)().features(torch.randn(1, 3, 224, 224)).shape == (1, 512, 13, 13)
    with pytest.raises(ValueError, match="supported versions"):
        models.SqueezeNet("2.0")


def test_densenet_is_torchvisions_with_paddles_arguments():
    for layers in (121, 161, 169, 201):
        ours, ref = getattr(models, f"densenet{layers}")(), getattr(tv, f"densenet{layers}")()
        assert n_params(ours) == n_params(ref)
        assert [k for k in ours.state_dict()] == [k for k in ref.state_dict()]
    import torchvision.models.densenet as tvd

    assert n_params(models.densenet264()) == n_params(tvd.DenseNet(32, (6, 12, 64, 48), 64))
    ours, ref = models.DenseNet(121).eval(), tv.densenet121().eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x))
    assert models.DenseNet(121, num_classes=0)(x).shape == (1, 1024, 1, 1)
    assert models.DenseNet(121, num_classes=0, with_pool=False)(x).shape == (1, 1024, 2, 2)
    with pytest.raises(ValueError, match="supported layers are"):
        models.DenseNet(100)


@pytest.mark.parametrize("scale, tv_name", [(0.5, "shufflenet_v2_x0_5"), (1.0, "shufflenet_v2_x1_0")])
def test_shufflenet_v2_is_torchvisions_network_with_paddles_names(scale, tv_name):
    ours, ref = models.ShuffleNetV2(scale=scale).eval(), getattr(tv, tv_name)().eval()
    assert n_params(ours) == n_params(ref) and "2_1._conv_dw_1.0.weight" in ours.state_dict()
    mine, theirs = ours.state_dict(), ref.state_dict()
    assert [v.shape for v in mine.values()] == [v.shape for v in theirs.values()]  # same layers, same order
    ours.load_state_dict(dict(zip(mine, theirs.values())))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x))


def test_shufflenet_v2_paddle_only_variants():
    assert models.shufflenet_v2_x0_25()(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
    assert models.shufflenet_v2_x0_33(num_classes=0, with_pool=False)(torch.randn(1, 3, 64, 64)).shape == \
        (1, 512, 2, 2)
    swish = models.shufflenet_v2_swish()
    assert isinstance(swish._conv1[2], torch.nn.SiLU) and n_params(swish) == n_params(models.shufflenet_v2_x1_0())
    with pytest.raises(NotImplementedError, match="scale=0.75 is not implemented"):
        models.ShuffleNetV2(scale=0.75)


def test_googlenet_returns_paddles_three_outputs():
    net = models.googlenet()
    out, out1, out2 = net(torch.randn(1, 3, 224, 224))  # Paddle's docstring: three [1, 1000] outputs
    assert out.shape == out1.shape == out2.shape == (1, 1000)
    sd = net.state_dict()
    assert not any(k.endswith("_conv.bias") for k in sd) and not any("bn" in k or "running" in k for k in sd)
    assert sd["_ince5b._conv5._conv.weight"].shape == (128, 48, 5, 5) and sd["_fc_o2.weight"].shape == (1024, 1152)
    feats = models.GoogLeNet(num_classes=0)(torch.randn(1, 3, 224, 224))
    assert [f.shape for f in feats] == [(1, 1024, 1, 1), (1, 512, 3, 3), (1, 528, 3, 3)]  # 128 * 3 * 3 = 1152


def test_inception_v3_is_torchvisions_blocks_with_paddles_head():
    ours = models.inception_v3()
    ref = tv.inception_v3(aux_logits=False, init_weights=False)
    assert n_params(ours) == n_params(ref) and "AuxLogits.fc.weight" not in ours.state_dict()
    assert all(m.eps == 1e-5 for m in ours.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert ours(torch.randn(1, 3, 299, 299)).shape == (1, 1000)  # Paddle's docstring: [1, 1000]
    feats = models.InceptionV3(num_classes=0).eval()
    ref.eval()
    for m in ref.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eps = 1e-5
    feats.load_state_dict({k: v for k, v in ref.state_dict().items() if not k.startswith("fc.")})
    x = torch.randn(1, 3, 299, 299)
    with torch.no_grad():
        want = x
        for name in ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1", "Conv2d_4a_3x3",
                     "maxpool2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d",
                     "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "avgpool"):
            want = getattr(ref, name)(want)
        torch.testing.assert_close(feats(x), want)
