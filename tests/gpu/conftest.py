"""The GPU suite: every test here is marked ``gpu`` and skipped without CUDA (``make test-gpu`` runs it).

Each test says what it needs with ``gpu_helpers.needs_gpus(n)``; group A needs one GPU, group B two or more.
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="no CUDA device: the GPU suite runs with `make test-gpu` on a GPU machine")
    for item in items:
        if "/tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
