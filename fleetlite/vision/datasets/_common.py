"""What the file readers share: the data-set error, default folders, a download lock, Paddle's item types."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..image import IMAGE_BACKENDS, get_image_backend

__all__ = ["DatasetError", "default_root", "file_lock", "resolve_backend", "paddle_item"]


class DatasetError(RuntimeError):
    """A data set file exists but cannot be used (truncated, corrupted, not the expected format)."""


def default_root(name: str = "cifar10") -> Path:
    """``$FLEETLITE_DATA_HOME/<name>``, else ``~/.cache/fleetlite/datasets/<name>``."""
    home = os.environ.get("FLEETLITE_DATA_HOME") or os.path.join("~", ".cache", "fleetlite", "datasets")
    return Path(home).expanduser() / name


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock on ``path`` (POSIX; elsewhere no lock): one rank downloads, others wait."""
    try:
        import fcntl  # POSIX only
    except ImportError:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def resolve_backend(backend: str | None) -> str:
    """Paddle's ``backend`` argument: ``None`` means :func:`fleetlite.vision.get_image_backend`; ``'numpy'`` is
    accepted as fleetlite's older name of ``'cv2'``."""
    if backend is None:
        return get_image_backend()
    if backend == "numpy":
        return "cv2"
    if backend not in IMAGE_BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {list(IMAGE_BACKENDS)} (Paddle's names; 'cv2' "
                         "gives float32 numpy arrays, 'pil' PIL images)")
    return backend


def _numpy_dtype() -> np.dtype:
    return torch.empty(0, dtype=torch.get_default_dtype()).numpy().dtype


def paddle_item(image: np.ndarray, label: np.ndarray, transform: Callable | None, backend: str) -> tuple[Any, Any]:
    """One item as Paddle's readers return it: the uint8 ``image`` as a PIL image (``'pil'``) or as is (``'cv2'``),
    transformed, then for ``'cv2'`` cast to the default float dtype (float32); ``label`` unchanged."""
    if backend == "pil":
        from PIL import Image  # torchvision's dependency; loaded only for PIL items

        image = Image.fromarray(image)
    if transform is not None:
        image = transform(image)
    if backend == "pil":
        return image, label
    if isinstance(image, torch.Tensor):
        return image.to(torch.get_default_dtype()), label
    return np.asarray(image).astype(_numpy_dtype()), label
