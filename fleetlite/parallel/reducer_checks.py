"""The reducer's error and warning messages, raised the same way on every rank."""

from __future__ import annotations

import warnings

import torch.distributed as tdist

__all__ = ["TAIL_FLAGS", "ready_twice_error", "missing_error", "interrupted_error", "warn_discarded"]

TAIL_FLAGS = 2  # Note [bucket tail]: [missing-gradient count, interrupted-rank count], then the used map

_RECOMPUTE_HINT = (
    "This happens when one parameter's gradient is accumulated in two backward passes of one step: a "
    "PyLayer / reentrant checkpoint (torch.utils.checkpoint(..., use_reentrant=True)) that runs the same "
    "layers twice or shares weights across checkpoints, a parameter used outside forward(), or backward run "
    "twice for one forward. Fixes, as with torch DDP: wrap with DataParallel(model, static_graph=True) when "
    "the set of used parameters is the same every step; or use torch.utils.checkpoint(..., "
    "use_reentrant=False); or run such steps under `model.no_sync()` and call "
    "`fused_allreduce_gradients(list(model.parameters()), None)` before the optimizer step. With "
    "find_unused_parameters=True, the parameters inside a reentrant checkpoint are not seen by the graph "
    "walk after forward: use static_graph=True instead."
)


def ready_twice_error(name: str) -> RuntimeError:
    return RuntimeError(
        f"DataParallel: parameter {name!r} received a gradient after it was already marked ready in this "
        f"backward pass (its bucket may already be reduced). {_RECOMPUTE_HINT}"
    )


def missing_error(names: list[str], missing: list[int], group, world: int) -> RuntimeError:
    """The 'no gradient' error; a collective: every rank calls it at the same point (Note [bucket tail])."""
    mine = [names[i] for i in missing]
    everyone: list = [None] * world
    tdist.all_gather_object(everyone, mine, group=group)
    detail = "; ".join(f"rank {r}: {', '.join(ns[:10])}{' ...' if len(ns) > 10 else ''}"
                       for r, ns in enumerate(everyone) if ns)
    return RuntimeError(
        "DataParallel: some parameters received no gradient in this backward pass, so their all-reduce "
        f"could not be matched across ranks ({detail}). If parts of the model are legitimately unused in "
        "some steps, wrap it with DataParallel(model, find_unused_parameters=True); if they are never "
        "used, remove them or set requires_grad=False."
    )


def interrupted_error(ranks: int) -> RuntimeError:
    return RuntimeError(
        f"DataParallel: the backward pass of this step was interrupted by an exception on {ranks} other "
        "rank(s) (e.g. an out-of-memory error that was caught). Their gradients for this step never came, so "
        "this rank's averaged gradients would be wrong: they were discarded (.grad is None) and this rank "
        "is back in step with the others. Skip the optimizer step for this batch (catch this error as the "
        "other ranks caught theirs) and go on with the next one."
    )


def warn_discarded(done: int, total: int) -> None:
    warnings.warn(
        f"DataParallel: the previous backward pass raised after {done} of {total} gradient buckets were "
        "sent for all-reduce. The step's remaining all-reduces were completed (as zeros) so that the ranks "
        "stay matched, and its gradients were discarded (.grad is None, including any accumulated under "
        "no_sync). Ranks whose backward had completed raise an error telling them to skip this step.",
        RuntimeWarning, stacklevel=4,
    )
