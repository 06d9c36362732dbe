"""Exact distributed evaluation: count every sample of an evaluation set exactly once across ranks.

A :class:`DistributedBatchSampler` gives every rank the same number of
batches by repeating a few samples at the end (Note [sampler layout]); in
each local batch those repeats are the trailing rows, and ``num_valid(i)``
says how many leading rows are real. :func:`drop_padding` iterates a loader
and cuts the repeats off, and :func:`global_sum` adds per-rank totals in
float64, so that ``sum(correct) / sum(count)`` over all ranks equals the
single-process metric exactly, for any dataset size, batch size and world
size. (A plain loop over torch's ``DistributedSampler`` counts its repeats
twice; :func:`drop_padding` removes those too.)

Example::

    from fleetlite.io import DataLoader, DistributedBatchSampler, drop_padding, global_sum
    sampler = DistributedBatchSampler(test_set, batch_size=64)          # drop_last=False
    loader = DataLoader(test_set, batch_sampler=sampler)
    correct = count = 0
    for x, y in drop_padding(loader):
        correct += (model(x).argmax(1) == y).sum().item()
        count += len(y)
    correct, count = global_sum(correct, count)                        # same on every rank
    accuracy = correct / count

Under hybrid parallelism (mp or pp > 1) split and sum over the data-parallel group only (the ranks of one
tensor-parallel group or pipeline hold the same samples): build the sampler with
``num_replicas=hcg.get_data_parallel_world_size(), rank=hcg.get_data_parallel_rank()`` and call
``global_sum(..., group=hcg.get_data_parallel_group())``; the Trainer does both (Note [data group] in
``fleetlite.distributed.fleet.data_group``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from ..distributed import collective
from .sampler import DistributedBatchSampler

__all__ = ["find_batch_sampler", "trim_batch", "drop_padding", "global_sum", "torch_sampler_num_valid"]


def find_batch_sampler(loader: Any) -> DistributedBatchSampler | None:
    """The :class:`DistributedBatchSampler` that drives ``loader`` (a DataLoader, TensorLoader or the sampler)."""
    if isinstance(loader, DistributedBatchSampler):
        return loader
    sampler = getattr(loader, "batch_sampler", None)
    return sampler if isinstance(sampler, DistributedBatchSampler) else None


def trim_batch(batch: Any, n: int) -> Any:
    """Keep the first ``n`` rows of every tensor (and list/tuple of per-sample values) in ``batch``.

    Works on nested tuples, lists and dicts as a ``DataLoader`` collates them;
    0-d tensors and other scalars are left alone.
    """
    if isinstance(batch, torch.Tensor):
        return batch[:n] if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        items = {k: trim_batch(v, n) for k, v in batch.items()}
        try:
            return type(batch)(items)
        except TypeError:
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(trim_batch(v, n) for v in batch))
    if isinstance(batch, (tuple, list)):
        if batch and all(not isinstance(v, (torch.Tensor, Mapping, tuple, list)) for v in batch):
            return type(batch)(batch[:n])  # a list of per-sample values (e.g. file names)
        return type(batch)(trim_batch(v, n) for v in batch)
    return batch


def torch_sampler_num_valid(sampler: torch.utils.data.DistributedSampler, batch_size: int, index: int) -> int:
    """Leading real samples of local batch ``index`` of a loader over torch's ``DistributedSampler``.

    torch pads its (shuffled) index list at the end and deals it out
    round-robin: local sample ``j`` of rank ``r`` is position ``r + j * R``,
    real when below ``N``; so the real samples lead every local list too.
    (With ``drop_last=True`` on the sampler nothing is padded: all are real.)
    """
    real_local = max(0, math.ceil((len(sampler.dataset) - sampler.rank) / sampler.num_replicas))
    return max(0, min(batch_size, real_local - index * batch_size))


def _torch_sampler_counter(loader: Any) -> Callable[[int], int] | None:
    """``num_valid`` for a DataLoader over torch's ``DistributedSampler`` (None when it is not one)."""
    sampler = getattr(loader, "sampler", None)
    if not isinstance(sampler, torch.utils.data.DistributedSampler):
        return None
    if sampler.drop_last or getattr(loader, "drop_last", False):
        raise ValueError("cannot evaluate exactly with drop_last=True (on the DistributedSampler or the "
                         "DataLoader): some samples are never seen; use drop_last=False for evaluation")
    batch_size = getattr(loader, "batch_size", None)
    if batch_size is None:
        return None
    return lambda i: torch_sampler_num_valid(sampler, batch_size, i)


def _unknown_split_reason(loader: Any) -> str | None:
    """Why ``loader`` cannot be evaluated exactly across ranks (``None``: one rank, nothing to drop)."""
    world = collective.get_world_size()
    if world > 1:
        return (f"no DistributedBatchSampler (nor torch DistributedSampler) drives it, so with {world} ranks "
                "the split across ranks and its padding are unknown")
    return None


def drop_padding(loader: Iterable) -> Iterator[Any]:
    """Iterate ``loader`` with the padding rows of each batch removed (exact distributed evaluation).

    Works for loaders driven by a :class:`DistributedBatchSampler` (a
    ``DataLoader(..., batch_sampler=...)`` or a :class:`TensorLoader`) and for
    a ``DataLoader`` over torch's ``DistributedSampler``. Every rank yields the
    same number of batches, so per-batch collectives stay aligned; a batch
    may be empty on some ranks (0 rows) when the dataset is smaller than
    ``world_size * batch_size``. Any other loader is passed through unchanged
    when the world size is 1.

    Raises:
        ValueError: the loader drops samples (``drop_last=True``) or its split
            across several ranks is unknown; raised before the first batch.
    """
    sampler = find_batch_sampler(loader)
    if sampler is not None:
        if sampler.drop_last:
            raise ValueError("cannot evaluate exactly with drop_last=True: the samples of the incomplete last "
                             "batch are never seen; build the evaluation sampler/loader with drop_last=False")
        count = sampler.num_valid
    else:
        count = _torch_sampler_counter(loader)
        if count is None:
            reason = _unknown_split_reason(loader)
            if reason is not None:
                raise ValueError(f"cannot evaluate {type(loader).__name__} exactly: {reason}. Build it as "
                                 "DataLoader(dataset, batch_sampler=DistributedBatchSampler(dataset, batch_size)) "
                                 "or use fleetlite.io.TensorLoader(..., shuffle=False, augment=False)")
            yield from loader
            return
    for i, batch in enumerate(loader):
        yield trim_batch(batch, count(i))


def global_sum(*values: float | int | torch.Tensor, group: Any = None) -> tuple[Any, ...]:
    """Sum each value over all ranks of ``group`` (the world by default; under hybrid parallelism pass the
    data-parallel group) in float64 for floats, int64 for ints; the inputs single-process.

    Returns a tuple in the input order, of Python numbers for Python
    numbers and of tensors (on the input's device) for tensors.

    Example::

        correct, count = global_sum(correct, count)
    """
    if not values:
        raise TypeError("global_sum() needs at least one value")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float, torch.Tensor)):
            raise TypeError(f"global_sum() takes numbers or tensors, got {type(v).__name__}")
    if not collective.is_initialized():
        return tuple(values)
    out = []
    # one flat float64 buffer per device: ints up to 2**53 are exact in float64
    tensors = [v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float64) for v in values]
    # by the values' device (CUDA counts stay on the GPU, CPU ones go over gloo), not by the backend's name
    first = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
    device = collective.collective_device(first, group)
    flat = torch.cat([t.detach().to(device, torch.float64).reshape(-1) for t in tensors])
    collective.all_reduce(flat, group=group)
    pos = 0
    for v, t in zip(values, tensors):
        part = flat[pos:pos + t.numel()].view(t.shape)
        pos += t.numel()
        if isinstance(v, torch.Tensor):
            dtype = torch.int64 if not (v.is_floating_point() or v.is_complex()) else torch.float64
            out.append(part.to(v.device, dtype))
        elif isinstance(v, int):
            out.append(int(round(part.item())))
        else:
            out.append(float(part.item()))
    return tuple(out)

