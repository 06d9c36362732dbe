"""NaN-safe differences for the parity tests (``tests/`` is on ``sys.path``: import it as ``parity``).

Python's ``max`` keeps its first argument when a later one is NaN (``max(0.0, nan) == 0.0``, and
``max([1.0, nan]) == 1.0``), and ``nan > tol`` is False: a check built on either passes when a run produced NaN.
Every function here returns NaN (or inf) as soon as one compared value is NaN (or inf), so ``assert diff <= tol``
fails, and ``close`` is False.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch


def worst(values: Iterable) -> float:
    """The largest of ``values`` (numbers or one-element tensors), NaN if any of them is NaN; 0.0 for none."""
    floats = [float(v) for v in values]
    if any(math.isnan(v) for v in floats):
        return math.nan
    return max(floats, default=0.0)


def _tensor_diff(a, b, where: str) -> float:
    a, b = torch.as_tensor(a).detach(), torch.as_tensor(b).detach()
    assert a.shape == b.shape, f"{where}: shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    if a.numel() == 0:
        return 0.0
    return (a.double() - b.double()).abs().max().item()  # torch's max propagates NaN


def max_abs_diff(a, b) -> float:
    """max |a - b| over two tensors, two mappings of tensors (every key of ``a`` must be in ``b``), or two
    sequences of tensors; NaN if any element on either side is NaN, inf if one is infinite."""
    if isinstance(a, Mapping):
        missing = sorted(str(k) for k in a if k not in b)
        assert not missing, f"keys missing from the reference: {missing}"
        return worst(max_abs_diff(v, b[k]) for k, v in a.items())
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{len(a)} vs {len(b)} values"
        return worst(max_abs_diff(x, y) for x, y in zip(a, b))
    return _tensor_diff(a, b, "tensor")


def close(a, b, tol: float) -> bool:
    """Whether ``a`` and ``b`` (as for ``max_abs_diff``) agree within ``tol``; False when either holds a NaN."""
    return max_abs_diff(a, b) <= tol
