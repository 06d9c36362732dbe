"""Bucket planning and flat gradient buffers.

Note [bucket order]
    Parameters are planned in *reverse registration order*: that is roughly
    the order in which autograd makes their gradients ready (the last layer
    first). Buckets are numbered in that order and are always reduced in
    increasing index, on every rank, whatever order the hooks fire in: a
    mismatched collective order across ranks is the classic data-parallel
    hang. Every rank computes the same plan from the same (verified) list of
    parameters, so the numbering agrees everywhere.

Note [last bucket]
    The bucket reduced last holds the first layers; its gradients become
    ready at the very end of backward, so nothing overlaps its all-reduce.
    It is capped at ``last_comm_buffer_size`` (small) so little is left to
    wait for when backward ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["Bucket", "plan_buckets", "module_units", "MB"]

MB = 1024 * 1024


@dataclass
class Bucket:
    """One flat buffer of gradients of a single dtype and device."""

    index: int
    dtype: torch.dtype
    device: torch.device
    param_indices: list[int]  # positions in the engine's parameter list
    offsets: list[int] = field(default_factory=list)  # element offset of each parameter in the buffer
    numel: int = 0
    buffer: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def _size_bytes(mb: float, name: str) -> int:
    if not isinstance(mb, (int, float)) or isinstance(mb, bool) or mb <= 0:
        raise ValueError(f"{name}={mb!r} must be a positive number of MB (e.g. 25 or 0.5)")
    return max(1, int(mb * MB))


def module_units(names: Sequence[str]) -> list[str]:
    """The owning module of each parameter name (``"layers.3.weight"`` -> ``"layers.3"``)."""
    return [n.rpartition(".")[0] for n in names]


def _units(params: Sequence[torch.Tensor], units: Sequence[object] | None, cap: int) -> list[list[int]]:
    """Runs of consecutive parameters of one unit (module) and one (dtype, device).

    A run larger than ``cap`` is split into single parameters: keeping it whole
    would only make an oversized bucket.
    """
    runs: list[list[int]] = []
    prev = None
    for i, p in enumerate(params):
        key = (units[i] if units is not None else i, p.dtype, p.device)
        if runs and key == prev:
            runs[-1].append(i)
        else:
            runs.append([i])
        prev = key
    out = []
    for run in runs:
        if len(run) > 1 and sum(params[i].numel() * params[i].element_size() for i in run) > cap:
            out.extend([i] for i in run)
        else:
            out.append(run)
    return out


def plan_buckets(params: Sequence[torch.Tensor], comm_buffer_size: float = 25,
                 last_comm_buffer_size: float = 1, units: Sequence[object] | None = None) -> list[Bucket]:
    """Group ``params`` into buckets; see Note [bucket order] and Note [last bucket].

    ``params`` are given in registration order. Each bucket holds parameters
    of one (dtype, device), in reverse registration order, up to
    ``comm_buffer_size`` MB (a single larger parameter gets a bucket of its own).
    The bucket reduced last (it holds the first parameters) is capped at
    ``last_comm_buffer_size`` MB. ``units`` (e.g. :func:`module_units`) keeps
    the parameters of one module together when they fit in a bucket: a layer's
    bias and weight become ready at the same moment, so splitting them would
    make a bucket wait for the next layer's backward. Returns buckets in reduction order, with
    element offsets filled in (buffers are not allocated here).

    >>> ps = [torch.zeros(1000) for _ in range(4)]
    >>> [b.param_indices for b in plan_buckets(ps, comm_buffer_size=0.008, last_comm_buffer_size=0.004)]
    [[3, 2], [1], [0]]
    >>> [b.param_indices for b in plan_buckets(ps, 0.008, 0.004, units=["a", "a", "b", "b"])]
    [[3, 2], [1, 0]]
    """
    cap = _size_bytes(comm_buffer_size, "comm_buffer_size")
    last_cap = _size_bytes(last_comm_buffer_size, "last_comm_buffer_size")
    if not params:
        return []
    runs = _units(params, units, cap)

    def nbytes(run: list[int]) -> int:
        return sum(params[i].numel() * params[i].element_size() for i in run)

    # The last bucket is filled first, from the front of the model, so that it is the one capped.
    key0 = (params[0].dtype, params[0].device)
    n_last, last_bytes = 0, 0
    for run in runs:
        p = params[run[0]]
        size = nbytes(run)
        if (p.dtype, p.device) != key0 or (n_last and last_bytes + size > last_cap):
            break
        n_last += 1
        last_bytes += size
    last_members = [i for run in runs[:n_last] for i in run]
    open_buckets: dict[tuple, list[int]] = {}
    open_bytes: dict[tuple, int] = {}
    groups: list[list[int]] = []
    for run in reversed(runs[n_last:]):
        p = params[run[0]]
        key = (p.dtype, p.device)
        size = nbytes(run)
        if key in open_buckets and open_bytes[key] + size > cap:
            groups.append(open_buckets.pop(key))
            del open_bytes[key]
        open_buckets.setdefault(key, []).extend(reversed(run))
        open_bytes[key] = open_bytes.get(key, 0) + size
    groups.extend(open_buckets.values())  # leftovers, in the order their keys were opened
    groups.sort(key=lambda g: -g[0])  # reduction order: by the position of each bucket's latest parameter
    groups.append(sorted(last_members, reverse=True))
    buckets = []
    for bi, members in enumerate(groups):
        p0 = params[members[0]]
        b = Bucket(bi, p0.dtype, p0.device, members)
        off = 0
        for i in members:
            b.offsets.append(off)
            off += params[i].numel()
        b.numel = off
        buckets.append(b)
    return buckets
