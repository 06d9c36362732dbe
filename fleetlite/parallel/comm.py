"""Coalesced collectives shared by the engine and ``fused_allreduce_gradients``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as tdist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..distributed.env import read_env

__all__ = ["broadcast_coalesced", "verify_same_params", "allreduce_mean_coalesced", "group_size", "global_src"]


def group_size(group=None) -> int:
    """Processes in ``group``; 1 single-process.

    Raises when a launcher started several processes but no process group
    exists: wrapping or reducing then would let every rank train alone, silently.
    """
    if tdist.is_available() and tdist.is_initialized():
        return tdist.get_world_size(group)
    world = read_env().world_size
    if world > 1:
        raise RuntimeError(
            f"the launcher started {world} processes (WORLD_SIZE / PADDLE_TRAINERS_NUM = {world}) but no process "
            "group exists, so gradients could not be averaged and every rank would train alone. Call "
            "fleetlite.distributed.init_parallel_env() (or fleet.init()) before wrapping the model or reducing "
            "gradients."
        )
    return 1


def global_src(group=None) -> int:
    """Global rank of the group's rank 0 (the authoritative copy)."""
    return 0 if group is None else tdist.get_global_rank(group, 0)


def _chunks_by_dtype(tensors: Sequence[torch.Tensor], cap_bytes: int):
    """Consecutive runs of same-(dtype, device) tensors, each at most ``cap_bytes`` (a bigger tensor alone)."""
    by_key: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        by_key.setdefault((t.dtype, t.device), []).append(t)
    for group in by_key.values():
        chunk, size = [], 0
        for t in group:
            nbytes = t.numel() * t.element_size()
            if chunk and size + nbytes > cap_bytes:
                yield chunk
                chunk, size = [], 0
            chunk.append(t)
            size += nbytes
        if chunk:
            yield chunk


def broadcast_coalesced(tensors: Iterable[torch.Tensor], group=None, cap_bytes: int = 256 * 1024 * 1024,
                        src: int = 0) -> None:
    """Broadcast ``tensors`` in place from the group's rank ``src``, one flat message per dtype chunk."""
    tensors = [t for t in tensors if t.numel() > 0]
    if group_size(group) == 1 or not tensors:
        return
    src = global_src(group) if src == 0 else (src if group is None else tdist.get_global_rank(group, src))
    is_src = tdist.get_rank() == src
    for chunk in _chunks_by_dtype(tensors, cap_bytes):
        with torch.no_grad():
            flat = _flatten_dense_tensors([t.detach() for t in chunk])
            tdist.broadcast(flat, src=src, group=group)
            if not is_src:
                for t, new in zip(chunk, _unflatten_dense_tensors(flat, chunk)):
                    t.copy_(new)


def allreduce_mean_coalesced(tensors: Sequence[torch.Tensor], group=None,
                             cap_bytes: int = 128 * 1024 * 1024) -> None:
    """Average ``tensors`` in place over the group: flat buffers of at most ``cap_bytes`` per dtype.

    Each buffer is scaled by ``1/world`` before the sum (no fp16 overflow).
    """
    world = group_size(group)
    if world == 1 or not tensors:
        return
    for chunk in _chunks_by_dtype(tensors, cap_bytes):
        with torch.no_grad():
            flat = _flatten_dense_tensors(chunk)
            flat.mul_(1.0 / world)
            tdist.all_reduce(flat, group=group)
            for t, new in zip(chunk, _unflatten_dense_tensors(flat, chunk)):
                t.copy_(new)


def verify_same_params(named: Sequence[tuple[str, torch.Tensor]], group=None, owner: str = "DataParallel",
                       what: str = "parameter") -> None:
    """Check every rank holds the same tensor names, shapes and dtypes.

    Raises the same ``ValueError`` on every rank, naming the first differing
    tensor and the ranks, so no rank is left waiting in a collective.
    """
    if group_size(group) == 1:
        return
    mine = [(n, tuple(p.shape), str(p.dtype).replace("torch.", "")) for n, p in named]
    everyone: list = [None] * tdist.get_world_size(group)
    tdist.all_gather_object(everyone, mine, group=group)
    ref = everyone[0]
    for rank, sig in enumerate(everyone[1:], start=1):
        if sig == ref:
            continue
        for k in range(max(len(ref), len(sig))):
            a = ref[k] if k < len(ref) else None
            b = sig[k] if k < len(sig) else None
            if a != b:
                break
        name = (a or b)[0]

        def show(s):
            return f"no such {what}" if s is None else f"{s[0]!r} shape {s[1]} {s[2]}"

        raise ValueError(
            f"{owner}: the model differs across ranks at {what} #{k} ({name!r}): rank 0 has {show(a)}, "
            f"rank {rank} has {show(b)}. Every rank must build the same model (same architecture, same "
            f"requires_grad flags, same config) before wrapping it."
        )
