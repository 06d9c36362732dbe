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

__all__ = ["Bucket", "plan_buckets", "MB"]

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


def plan_buckets(params: Sequence[torch.Tensor], comm_buffer_size: float = 25,
                 last_comm_buffer_size: float = 1) -> list[Bucket]:
    """Group ``params`` into buckets; see Note [bucket order] and Note [last bucket].

    ``params`` are given in registration order. Each bucket holds parameters
    of one (dtype, device), in reverse registration order, up to
    ``comm_buffer_size`` MB (a single larger parameter gets a bucket of its
    own). The bucket reduced last (it holds the first parameter) is capped at
    ``last_comm_buffer_size`` MB. Returns buckets in reduction order, with
    element offsets filled in (buffers are not allocated here).

    >>> ps = [torch.zeros(1000) for _ in range(4)]
    >>> [b.param_indices for b in plan_buckets(ps, comm_buffer_size=0.008, last_comm_buffer_size=0.004)]
    [[3, 2], [1], [0]]
    """
    cap = _size_bytes(comm_buffer_size, "comm_buffer_size")
    last_cap = _size_bytes(last_comm_buffer_size, "last_comm_buffer_size")
    order = list(range(len(params)))[::-1]
    if not order:
        return []
    # The last bucket is filled first, from the front of the model, so that it is the one capped.
    last_members: list[int] = []
    last_bytes = 0
    first = params[0]
    key0 = (first.dtype, first.device)
    for i in range(len(params)):
        p = params[i]
        if (p.dtype, p.device) != key0:
            break
        nbytes = p.numel() * p.element_size()
        if last_members and last_bytes + nbytes > last_cap:
            break
        last_members.append(i)
        last_bytes += nbytes
    taken = set(last_members)
    open_buckets: dict[tuple, list[int]] = {}
    open_bytes: dict[tuple, int] = {}
    groups: list[list[int]] = []
    for i in order:
        if i in taken:
            continue
        p = params[i]
        key = (p.dtype, p.device)
        nbytes = p.numel() * p.element_size()
        if key in open_buckets and open_bytes[key] + nbytes > cap:
            groups.append(open_buckets.pop(key))
            del open_bytes[key]
        open_buckets.setdefault(key, []).append(i)
        open_bytes[key] = open_bytes.get(key, 0) + nbytes
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
