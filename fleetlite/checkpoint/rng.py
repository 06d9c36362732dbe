"""RNG states as checkpoint-safe values: what a bit-identical resume puts back (Note [resume order])."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch

from ..distributed import ParallelEnv

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states (torch CPU and CUDA, python ``random``, numpy) as checkpoint-safe values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # the rank's own device only: its index differs under another CUDA_VISIBLE_DEVICES, its stream does not
        state["cuda_device"] = torch.cuda.get_rng_state(_rank_cuda_device())
    return state


def _rank_cuda_device() -> torch.device:
    return ParallelEnv().device


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore states captured by :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    own = state.get("cuda_device")
    if own is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(own, _rank_cuda_device())
    cuda = state.get("cuda")  # older checkpoints: every visible device's state
    if own is None and cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            warnings.warn(f"fleetlite: the checkpoint holds CUDA RNG states for {len(cuda)} devices but "
                          f"{torch.cuda.device_count()} are visible; CUDA RNG states not restored", stacklevel=2)
