"""Splitting a fed batch across devices and concatenating fetched values (the ParallelExecutor's data path).

Note [split rule]
    Paddle splits ``n`` samples over ``k`` devices into ``n // k`` each and
    gives the ``n % k`` leftover samples, one each, to the *last* devices:
    3 samples on 2 devices -> [0] and [1, 2]. Every device needs at least one
    sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

__all__ = ["split_sizes", "prepare_feed", "concat_fetch"]


def split_sizes(n: int, k: int) -> list[int]:
    """Per-device sample counts for ``n`` samples on ``k`` devices; see Note [split rule].

    >>> split_sizes(3, 2), split_sizes(8, 3)
    ([1, 2], [2, 3, 3])
    """
    base, rem = divmod(n, k)
    return [base + (1 if i >= k - rem else 0) for i in range(k)]


def _as_tensor(name: str, value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"feed {name!r} is a {type(value).__name__}, which cannot become a tensor ({e}); "
                        "feed torch tensors or numpy arrays") from None


def _move(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if t.device == device else t.to(device, non_blocking=True)


def _split_dict(feed: Mapping, places: Sequence[torch.device], hint: str) -> list[dict[str, torch.Tensor]]:
    k = len(places)
    per_device: list[dict[str, torch.Tensor]] = [{} for _ in range(k)]
    for name, value in feed.items():
        if not isinstance(name, str):
            raise TypeError(f"feed keys must be the str names of forward's arguments; got {name!r}")
        t = _as_tensor(name, value)
        if t.dim() == 0:
            raise ValueError(f"feed {name!r} is a scalar, so it cannot be split across the {k} devices along "
                             "dimension 0; give it a batch dimension, or feed a list of one dict per device")
        n = t.shape[0]
        if n < k:
            raise ValueError(f"feed {name!r} has {n} sample(s) but the executor runs on {k} devices ({hint}): "
                             "every device needs at least one sample. Drop the last incomplete batch "
                             "(e.g. DataLoader(..., drop_last=True)) or use fewer devices")
        for i, part in enumerate(torch.split(t, split_sizes(n, k))):
            per_device[i][name] = _move(part, places[i])
    return per_device


def prepare_feed(feed, places: Sequence[torch.device], hint: str) -> list[dict[str, torch.Tensor]]:
    """One dict of tensors per device, on that device: a dict feed is split, a list feed is taken as is."""
    k = len(places)
    if feed is None:
        return [{} for _ in range(k)]
    if isinstance(feed, Mapping):
        return _split_dict(feed, places, hint)
    if isinstance(feed, (list, tuple)):
        if len(feed) != k:
            raise ValueError(f"a list feed needs one dict per device: got {len(feed)} dict(s) for {k} devices "
                             f"({hint}); pass exactly {k}, or pass a single dict to have the batch split")
        out = []
        for i, d in enumerate(feed):
            if not isinstance(d, Mapping):
                raise TypeError(f"feed[{i}] is a {type(d).__name__}; a list feed holds one dict per device")
            out.append({name: _move(_as_tensor(name, v), places[i]) for name, v in d.items()})
        return out
    raise TypeError(f"feed must be a dict (split across devices) or a list of one dict per device; "
                    f"got {type(feed).__name__}")


def concat_fetch(name: str, values: Sequence, return_numpy: bool):
    """Concatenate one fetched name's per-device values along dimension 0 (scalars: one value per device)."""
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"fetched {name!r} is a {type(v).__name__} on device {i}; forward must return tensors "
                            "for every fetchable name")
    target = torch.device("cpu") if return_numpy else values[0].device
    parts = [v.detach().to(target) for v in values]
    if any(p.dim() == 0 for p in parts):
        parts = [p.reshape(1) if p.dim() == 0 else p for p in parts]
    try:
        out = torch.cat(parts, dim=0)
    except RuntimeError as e:
        shapes = [tuple(p.shape) for p in parts]
        raise ValueError(f"fetched {name!r} has per-device shapes {shapes} that cannot be concatenated along "
                         f"dimension 0 ({e}); fetch tensors whose trailing dimensions agree") from None
    if not return_numpy:
        return out
    if out.dtype == torch.bfloat16:
        out = out.float()  # numpy has no bfloat16
    return out.numpy()
