"""Agreement across ranks: one answer on every rank, or an error on every rank.

The helpers every layer above uses when all ranks must decide alike: rank 0's
value everywhere (:func:`from_rank0`: the recipe's run directory, a
checkpoint's path), which ranks saw something (:func:`flagged_ranks`, or
:func:`flags_of_ranks` to read it later: a non-finite loss), whether every rank holds the same thing
(:func:`check_same_across_ranks`: the config, the model), and a side group of
its own for collectives that must not interleave with training's
(:func:`side_group`: background checkpoint saves, the pre-emption poll). Each
is a no-op without a process group.

Example::

    from fleetlite.distributed.agreement import check_same_across_ranks, from_rank0
    run_dir = from_rank0(make_run_dir() if rank == 0 else None)
    check_same_across_ranks("the recipe config", config_dict)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist

from .collective import _collective, all_gather_object, all_reduce, get_rank, get_world_size, is_initialized

__all__ = ["RankMismatchError", "from_rank0", "flagged_ranks", "flags_of_ranks", "side_group",
           "check_same_across_ranks", "differences"]

_side_groups: dict[str, tuple[Any, Any]] = {}  # name -> (default group it was made for, the side group)


class RankMismatchError(ValueError):
    """Ranks disagree on something that must be identical (config, model); the message lists the differences.

    Example::

        check_same_across_ranks("the recipe config", {"lr": 0.1})   # raises on every rank if a rank differs
    """


def side_group(name: str):
    """A gloo group over every rank for one purpose (``name``), made once per default process group.

    Collectives on it never interleave with those on the default group or on
    another name's group (e.g. a background checkpoint save and the training
    step). Making it is collective: every rank must reach the first call for
    a ``name`` in the same order. None without a process group.
    """
    if not is_initialized():
        return None
    world = tdist.distributed_c10d._get_default_group()  # torch has no public accessor
    held = _side_groups.get(name)
    if held is None or held[0] is not world:  # a group of an earlier, destroyed default group is unusable
        _side_groups[name] = (world, tdist.new_group(backend="gloo"))  # keeps `world` alive: ids stay unique
    return _side_groups[name][1]


def from_rank0(value: Any, group: Any = None) -> Any:
    """Rank 0's ``value`` on every rank (``value`` itself without a process group); collective.

    ``value`` is any picklable object; ``group`` (e.g. a :func:`side_group`)
    must hold rank 0.
    """
    if not is_initialized():
        return value
    holder = [value]
    _collective("broadcast_object_list", tdist.broadcast_object_list, holder, src=0, group=group)
    return holder[0]


def flags_of_ranks(flag: bool | torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """Every rank's ``flag`` as a ``world_size``-long float tensor on ``device``, the same on every rank.

    Collective (one all-reduce), and nothing is read on the host: with a 0-d ``flag`` tensor on a GPU the
    host queues the work and goes on (read the result later, e.g. through a non-blocking copy; see
    Note [non-finite loss] in :mod:`fleetlite.trainer.callbacks.terminate_on_nan`). Without a process group:
    ``flag`` as a 1-long tensor.
    """
    world = get_world_size() if is_initialized() else 1
    flags = torch.zeros(world, dtype=torch.float32, device=device)
    flags[get_rank() if world > 1 else 0] = torch.as_tensor(flag).to(device=device, dtype=torch.float32)
    if world > 1:
        all_reduce(flags)
    return flags


def flagged_ranks(flag: bool | torch.Tensor, device: torch.device | str = "cpu") -> list[int]:
    """The ranks whose ``flag`` is true, the same list on every rank (one all-reduce of ``device`` tensors).

    ``flag`` may be a 0-d tensor on ``device`` (no host sync before the
    collective); the answer is read on the host (a device sync: use :func:`flags_of_ranks` to read it later).
    Without a process group: ``[0]`` or ``[]``.
    """
    return [r for r, f in enumerate(flags_of_ranks(flag, device).tolist()) if f]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out or {prefix.rstrip("."): {}}
    if isinstance(value, (list, tuple)) and value and any(isinstance(v, (dict, list, tuple)) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): value}


_ABSENT = "<absent>"


def differences(reference: Any, other: Any) -> list[tuple[str, Any, Any]]:
    """``(key, reference value, other value)`` for each dotted key whose value differs (absent keys included)."""
    a, b = _flatten(reference), _flatten(other)
    keys = list(a) + [k for k in b if k not in a]
    return [(k, a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in keys if a.get(k, _ABSENT) != b.get(k, _ABSENT)]


def check_same_across_ranks(what: str, value: Any, hint: str = "", limit: int = 8) -> None:
    """Raise :class:`RankMismatchError` on every rank when some rank's ``value`` differs from rank 0's.

    Collective (one ``all_gather_object``); a no-op without a process group.
    ``value`` is plain data (dicts, lists, numbers, strings); the message
    lists up to ``limit`` differing keys with each rank's value.
    """
    if not is_initialized():
        return
    everyone = all_gather_object(value)
    lines = []
    for rank, theirs in enumerate(everyone[1:], start=1):
        for key, ref, got in differences(everyone[0], theirs):
            lines.append(f"{key or '<value>'}: rank 0 has {ref!r}, rank {rank} has {got!r}")
    if lines:
        shown = "; ".join(lines[:limit]) + (f"; and {len(lines) - limit} more" if len(lines) > limit else "")
        raise RankMismatchError(f"{what} differs across ranks ({shown}). Every rank must use the same {what}"
                                f"{'; ' + hint if hint else ''}.")
