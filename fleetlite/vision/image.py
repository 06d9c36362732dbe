"""Paddle's ``paddle.vision.image``: the default image backend of the data sets (``'pil'`` or ``'cv2'``).

Example::

    from fleetlite.vision import get_image_backend, set_image_backend
    set_image_backend("cv2")      # data sets built with backend=None now return float32 HWC arrays
    assert get_image_backend() == "cv2"
    set_image_backend("pil")
"""

from __future__ import annotations

__all__ = ["set_image_backend", "get_image_backend", "IMAGE_BACKENDS"]

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
