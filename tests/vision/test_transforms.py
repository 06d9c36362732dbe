"""Batched crop/flip and normalisation against per-image references (numpy padding, torchvision)."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from fleetlite.vision.transforms import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    crop_flip,
    normalize,
    random_crop_flip,
)

NP_MODE = {"zeros": "constant", "reflect": "reflect", "replicate": "edge"}


def reference_crop_flip(img, dy, dx, flip, padding, pad_mode):
    """One CHW image: pad with numpy, crop at (dy, dx), then flip (torchvision's RandomCrop + flip)."""
    c, h, w = img.shape
    padded = np.pad(img.numpy(), ((0, 0), (padding, padding), (padding, padding)), mode=NP_MODE[pad_mode])
    out = padded[:, dy:dy + h, dx:dx + w]
    return torch.from_numpy(np.ascontiguousarray(out[:, :, ::-1] if flip else out))


@pytest.mark.parametrize("pad_mode", ["zeros", "reflect", "replicate"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_crop_flip_matches_per_image_reference(pad_mode, dtype):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (40, 3, 12, 10), generator=g).to(dtype)
    dy = torch.randint(0, 9, (40,), generator=g)
    dx = torch.randint(0, 9, (40,), generator=g)
    flip = torch.rand(40, generator=g) < 0.5
    out = crop_flip(images, dy, dx, flip, padding=4, pad_mode=pad_mode)
    assert out.shape == images.shape and out.dtype == dtype
    for i in range(40):
        want = reference_crop_flip(images[i], int(dy[i]), int(dx[i]), bool(flip[i]), 4, pad_mode)
        assert torch.equal(out[i], want), (i, pad_mode)


def test_centre_offset_without_flip_is_identity_and_flip_mirrors():
    x = torch.randint(0, 256, (5, 3, 8, 8), dtype=torch.uint8)
    centre = torch.full((5,), 2)
    assert torch.equal(crop_flip(x, centre, centre, padding=2), x)
    assert torch.equal(crop_flip(x, centre, centre, torch.ones(5, dtype=torch.bool), padding=2), x.flip(3))


def test_random_crop_flip_is_seeded_and_per_sample():
    x = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8)
    a = random_crop_flip(x, generator=torch.Generator().manual_seed(1))
    b = random_crop_flip(x, generator=torch.Generator().manual_seed(1))
    c = random_crop_flip(x, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    same_image = x[:1].expand(64, -1, -1, -1).contiguous()
    outs = random_crop_flip(same_image, generator=torch.Generator().manual_seed(3))
    assert len({o.numpy().tobytes() for o in outs}) > 20  # each sample got its own crop/flip


def test_normalize_matches_torchvision_to_tensor_and_normalize():
    from PIL import Image
    from torchvision import transforms as T

    x = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    ref_t = T.Compose([T.ToTensor(), T.Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    want = torch.stack([ref_t(Image.fromarray(img.permute(1, 2, 0).numpy())) for img in x])
    got = normalize(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    cl = normalize(x, channels_last=True)
    assert cl.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous(
        memory_format=torch.channels_last)
    assert torch.equal(cl, got)


def test_clear_errors():
    x = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    z = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="pad_mode"):
        crop_flip(x, z, z, pad_mode="wrap")
    with pytest.raises(ValueError, match="reflect padding needs padding < image size"):
        crop_flip(x, z, z, padding=8, pad_mode="reflect")
    with pytest.raises(ValueError, match=r"dx must have shape \(2,\)"):
        crop_flip(x, z, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="uint8"):
        normalize(x.float())
    with pytest.raises(ValueError, match="one value per channel"):
        normalize(x, mean=(0.5,), std=(0.5,))


def test_torchvision_names_resolve_lazily():
    from torchvision.transforms import ToTensor

    from fleetlite.vision import transforms

    assert transforms.ToTensor is ToTensor
    with pytest.raises(AttributeError, match="NoSuchTransform"):
        transforms.NoSuchTransform  # noqa: B018


def test_importing_io_and_vision_does_not_import_torchvision():
    code = ("import sys, fleetlite, fleetlite.io, fleetlite.vision, fleetlite.vision.datasets, "
            "fleetlite.vision.transforms; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torchvision', 'PIL', 'hydra', 'rich')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_paddle_normalize_and_transpose_follow_paddles_broadcasting():
    from PIL import Image
    from torchvision.transforms import Normalize as TvNormalize

    from fleetlite.vision.transforms import Normalize, Transpose

    gray = np.arange(28 * 28, dtype=np.uint8).reshape(28, 28)
    # Paddle's MNIST programs: Normalize(mean=[127.5], std=[127.5], data_format='CHW') on a PIL 'L' image
    out = Normalize(mean=[127.5], std=[127.5], data_format="CHW")(Image.fromarray(gray))
    assert out.shape == (1, 28, 28) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], (gray.astype(np.float32) - 127.5) / 127.5, equal_nan=False)
    assert Normalize(127.5, 127.5)(gray).shape == (3, 28, 28)  # a number means three channels, as in Paddle
    rgb = np.random.default_rng(0).integers(0, 256, (4, 5, 3)).astype(np.float32)
    hwc = Normalize([1, 2, 3], [2, 4, 8], data_format="HWC", to_rgb=True)(rgb)
    np.testing.assert_allclose(hwc, (rgb[..., ::-1] - np.array([1, 2, 3])) / np.array([2, 4, 8]), rtol=1e-6,
                               equal_nan=False)
    x = torch.rand(3, 8, 8)
    torch.testing.assert_close(Normalize([0.1, 0.2, 0.3], [0.5, 0.6, 0.7])(x),
                               TvNormalize([0.1, 0.2, 0.3], [0.5, 0.6, 0.7])(x))
    assert Transpose()(gray).shape == (1, 28, 28) and Transpose()(Image.fromarray(gray)).shape == (1, 28, 28)
    assert Transpose((1, 0, 2))(rgb).shape == (5, 4, 3) and Transpose()(torch.zeros(4, 5, 3)).shape == (3, 4, 5)
    with pytest.raises(ValueError, match="data_format='NCHW'"):
        Normalize(data_format="NCHW")
