"""Batched image ops on tensors: per-sample crop and flip in one gather, uint8 to normalised float.

The generic half of the fast input path (:class:`~fleetlite.io.TensorLoader`
uses it): a whole batch ``(B, C, H, W)`` at once, on whatever device it lives
on, with per-sample parameters given as tensors. Nothing here knows a data
set: :mod:`fleetlite.vision.transforms` re-exports these ops with CIFAR-10's
statistics as ``normalize``'s defaults.

Example::

    from fleetlite.io.image_ops import crop_flip, normalize
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    y = normalize(x, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["PAD_MODES", "crop_flip", "random_crop_flip", "crop_flip_params", "normalize", "normalize_params"]

#: How pixels outside the image are filled: 0, the mirror image (no edge repeat), or the edge pixel.
PAD_MODES = ("zeros", "reflect", "replicate")


def _source_index(pos: torch.Tensor, size: int, pad_mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Map source coordinates (possibly outside ``0..size-1``) into the image; the mask of real ones for zeros."""
    if pad_mode == "reflect":
        pos = pos.abs()
        return torch.where(pos > size - 1, 2 * (size - 1) - pos, pos), None
    inside = (pos >= 0) & (pos < size) if pad_mode == "zeros" else None
    return pos.clamp(0, size - 1), inside


def crop_flip(images: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor | None = None,
              padding: int = 4, pad_mode: str = "zeros") -> torch.Tensor:
    """Crop every image of a batch at its own offset and flip the chosen ones, batched.

    Equivalent, image by image, to torchvision's ``RandomCrop(H, padding)``
    at offset ``(dy, dx)`` of the padded image followed by an optional
    horizontal flip, but done for the whole batch in one gather.

    Args:
        images: ``(B, C, H, W)`` tensor, any dtype and device.
        dy, dx: ``(B,)`` integer offsets in ``0..2*padding`` (``padding`` = no shift).
        flip: ``(B,)`` bool (or 0/1) tensor; ``None`` flips nothing.
        padding: pixels of padding on each side.
        pad_mode: ``"zeros"``, ``"reflect"`` or ``"replicate"``.

    Example::

        x = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4)
        y = crop_flip(x, torch.tensor([1]), torch.tensor([1]), padding=1)   # identity
        assert torch.equal(x, y)
    """
    if images.dim() != 4:
        raise ValueError(f"images must be a (B, C, H, W) batch, got shape {tuple(images.shape)}")
    if pad_mode not in PAD_MODES:
        raise ValueError(f"pad_mode={pad_mode!r} is not one of {PAD_MODES}")
    b, c, h, w = images.shape
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ValueError(f"padding={padding!r} must be an integer >= 0")
    if pad_mode == "reflect" and padding >= min(h, w):
        raise ValueError(f"reflect padding needs padding < image size, got padding={padding} for {h}x{w} images; "
                         "use pad_mode='zeros' or a smaller padding")
    for name, t in (("dy", dy), ("dx", dx)) + ((("flip", flip),) if flip is not None else ()):
        if t.shape != (b,):
            raise ValueError(f"{name} must have shape ({b},) (one value per image), got {tuple(t.shape)}")
    dev = images.device
    dy = dy.to(dev, torch.int64)
    dx = dx.to(dev, torch.int64)
    rows = torch.arange(h, device=dev).view(1, h) + (dy.view(b, 1) - padding)
    cols = torch.arange(w, device=dev).view(1, w).expand(b, w)
    if flip is not None:  # crop then flip: output column j reads cropped column w - 1 - j
        cols = torch.where(flip.to(dev, torch.bool).view(b, 1), (w - 1) - cols, cols)
    cols = cols + (dx.view(b, 1) - padding)
    rows, row_in = _source_index(rows, h, pad_mode)
    cols, col_in = _source_index(cols, w, pad_mode)
    pix = (rows.view(b, h, 1) * w + cols.view(b, 1, w)).view(b, 1, h * w).expand(b, c, h * w)
    out = images.reshape(b, c, h * w).gather(2, pix).view(b, c, h, w)
    if pad_mode == "zeros":  # a multiply by the 0/1 mask is ~10x faster than masked_fill_ with a broadcast mask
        out.mul_(row_in.view(b, 1, h, 1) & col_in.view(b, 1, 1, w))
    return out


def crop_flip_params(n: int, padding: int = 4, flip: bool = True, generator: torch.Generator | None = None,
                     device: torch.device | str | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Uniform per-sample offsets ``dy, dx`` in ``0..2*padding`` and flips with probability 1/2."""
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    fl = torch.randint(0, 2, (n,), generator=generator, device=device).bool() if flip else None
    return dy, dx, fl


def random_crop_flip(images: torch.Tensor, padding: int = 4, pad_mode: str = "zeros", flip: bool = True,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """:func:`crop_flip` with random per-sample parameters from ``generator`` (on the images' device)."""
    dy, dx, fl = crop_flip_params(images.shape[0], padding, flip, generator, images.device)
    return crop_flip(images, dy, dx, fl, padding, pad_mode)


def normalize_params(mean: Sequence[float], std: Sequence[float], device: torch.device | str | None = None,
                     dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, bias)`` of shape ``(1, C, 1, 1)`` on ``device`` such that ``x * scale + bias`` normalises uint8 ``x``.

    Made once and passed to :func:`normalize` (``params=``), they save two
    host-to-device copies per batch (each a sync on CUDA).
    """
    if len(mean) != len(std):
        raise ValueError(f"mean and std need one value per channel, got {len(mean)} and {len(std)}")
    if any(s <= 0 for s in std):
        raise ValueError(f"std={tuple(std)} must be positive")
    std_t = torch.tensor(std, dtype=torch.float64)
    c = len(std)
    scale = (1.0 / (255.0 * std_t)).to(device, dtype).view(1, c, 1, 1)
    bias = (-torch.tensor(mean, dtype=torch.float64) / std_t).to(device, dtype).view(1, c, 1, 1)
    return scale, bias


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float], channels_last: bool = False,
              dtype: torch.dtype = torch.float32, params: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> torch.Tensor:
    """``(images / 255 - mean) / std`` per channel for a uint8 ``(B, C, H, W)`` batch, as ``dtype``.

    Matches torchvision's ``ToTensor()`` + ``Normalize(mean, std)`` up to
    float rounding. With ``channels_last`` the float result is laid out
    NHWC (converting the floats is ~3x faster here than permuting uint8).
    ``params``: :func:`normalize_params` made once for this device and dtype
    (``mean``/``std`` are then not read).
    """
    if images.dtype != torch.uint8 or images.dim() != 4:
        raise ValueError(f"normalize expects a uint8 (B, C, H, W) batch, got {images.dtype} of shape "
                         f"{tuple(images.shape)}; convert floats yourself or pass the raw uint8 images")
    c = images.shape[1]
    if params is None and (len(mean) != c or len(std) != c):
        raise ValueError(f"mean and std need one value per channel ({c}), got {len(mean)} and {len(std)}")
    scale, bias = params if params is not None else normalize_params(mean, std, images.device, dtype)
    if scale.shape[1] != c or scale.device != images.device:
        raise ValueError(f"normalize params are for {scale.shape[1]} channels on {scale.device}, the batch has {c} "
                         f"on {images.device}; make them with normalize_params(mean, std, images.device)")
    # convert, then scale and shift in place: ~3x faster than a uint8 * float multiply with type promotion
    out = images.to(dtype).mul_(scale).add_(bias)
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out
