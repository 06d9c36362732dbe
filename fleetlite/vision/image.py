"""Paddle's ``paddle.vision.image``: the default image backend of the data sets (``'pil'`` or ``'cv2'``).

Example::

    from fleetlite.vision import get_image_backend, set_image_backend
    set_image_backend("cv2")      # data sets built with backend=None now return float32 HWC arrays
    assert get_image_backend() == "cv2"
    set_image_backend("pil")
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["set_image_backend", "get_image_backend", "image_load", "IMAGE_BACKENDS"]

#: Paddle's backends: ``'pil'`` gives PIL images, ``'cv2'`` float numpy arrays (fleetlite reads no OpenCV).
IMAGE_BACKENDS = ("pil", "cv2")
_backend = "pil"


def set_image_backend(backend: str) -> None:
    """Set the backend data sets use when built with ``backend=None`` (``'pil'``, the default, or ``'cv2'``)."""
    global _backend
    if backend not in IMAGE_BACKENDS:
        raise ValueError(f"Expected backend are one of {list(IMAGE_BACKENDS)}, but got {backend!r}")
    _backend = backend


def get_image_backend() -> str:
    """The backend data sets use when built with ``backend=None``: ``'pil'`` unless :func:`set_image_backend` said
    otherwise."""
    return _backend


def image_load(path: str | os.PathLike, backend: str | None = None) -> Any:
    """The image file at ``path``: a PIL image (``backend="pil"``) or, with ``"cv2"``, OpenCV's BGR uint8 array
    (``cv2.imread``; needs opencv-python). ``None``: :func:`get_image_backend`."""
    backend = get_image_backend() if backend is None else backend
    if backend not in IMAGE_BACKENDS:
        raise ValueError(f"Expected backend are one of {list(IMAGE_BACKENDS)}, but got {backend!r}")
    if backend == "pil":
        from PIL import Image

        return Image.open(path)
    try:
        import cv2
    except ImportError:
        raise ImportError("image_load(backend='cv2') reads files with OpenCV, which is not installed: "
                          "pip install opencv-python-headless, or use backend='pil'") from None
    return cv2.imread(os.fspath(path))
