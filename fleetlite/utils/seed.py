"""``fleetlite.seed_everything``: one call seeds Python, numpy, torch (CPU and every CUDA device).

Example::

    import fleetlite
    gen = fleetlite.seed_everything(42)                # reproducible initialisation and shuffles
    assert gen.initial_seed() == 42                    # the default torch.Generator, as paddle.seed returns one
    fleetlite.seed_everything(42, deterministic=True)  # plus torch's deterministic algorithms
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["seed_everything"]


def seed_everything(seed: int, deterministic: bool = False) -> torch.Generator:
    """Seed ``random``, ``numpy``, ``torch`` and CUDA with ``seed``; returns torch's default CPU generator (as
    ``paddle.seed`` returns Paddle's; ``.initial_seed()`` is ``seed``). It replaces ``paddle.seed``.

    ``PYTHONHASHSEED`` is set for child processes (data-loader workers, spawned ranks). With
    ``deterministic=True`` torch uses deterministic algorithms only (``torch.use_deterministic_algorithms``;
    an op without one raises), cuDNN autotuning is off, and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` is set, which
    cuBLAS needs for deterministic results. Every rank should call it with the same seed; the Trainer's data
    order is seeded separately (``fit(seed=...)``).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed_everything(seed={seed!r}): the seed must be an integer in [0, 2**32)")
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    generator = torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return generator
