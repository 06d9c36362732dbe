"""Recompute (activation checkpointing): ``torch.utils.checkpoint``, non-reentrant.

``recompute(fn, *args)`` is Paddle's ``fleet.utils.recompute``;
``apply_recompute(model, names)`` is what ``strategy.recompute`` does in
``fleet.distributed_model``: the named submodules run their forward under
checkpointing, so their activations are dropped after forward and
recomputed during backward. Gradients are identical to a plain run (RNG
state is replayed, so dropout masks match).

Note [recompute buffers]
    Recomputing a forward in training mode would update batch-norm running
    statistics a second time. The recompute pass therefore snapshots the
    running buffers of the batch-norm layers inside the region and restores
    them afterwards, so statistics match a plain run exactly.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

__all__ = ["recompute", "apply_recompute", "remove_recompute", "is_recomputed", "resolve_checkpoints"]


@contextlib.contextmanager
def _keep_bn_stats(modules: Iterable[nn.Module]):
    saved = []
    for m in modules:
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            saved.append([(buf, buf.detach().clone()) for buf in (m.running_mean, m.running_var,
                                                                   m.num_batches_tracked) if buf is not None])
    try:
        yield
    finally:
        with torch.no_grad():
            for pairs in saved:
                for buf, value in pairs:
                    buf.copy_(value)


def _context_fn(modules: Sequence[nn.Module]) -> Callable[[], tuple[Any, Any]]:
    return lambda: (contextlib.nullcontext(), _keep_bn_stats(modules))


def recompute(function: Callable[..., Any], *args: Any, preserve_rng_state: bool = True,
              use_reentrant: bool = False, **kwargs: Any) -> Any:
    """Run ``function(*args, **kwargs)`` without keeping its activations; recompute them in backward.

    Batch-norm statistics of a module ``function`` are kept exact (Note [recompute buffers]).

    >>> lin = torch.nn.Linear(4, 4)
    >>> x = torch.randn(2, 4, requires_grad=True)
    >>> recompute(lin, x).sum().backward()
    >>> x.grad.shape
    torch.Size([2, 4])
    """
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    if use_reentrant:
        return checkpoint(function, *args, use_reentrant=True, preserve_rng_state=preserve_rng_state, **kwargs)
    modules = list(function.modules()) if isinstance(function, nn.Module) else []
    return checkpoint(function, *args, use_reentrant=False, preserve_rng_state=preserve_rng_state,
                      context_fn=_context_fn(modules), **kwargs)


class _RecomputedForward:
    """Replaces a module's ``forward`` (instance attribute): the original forward under checkpointing."""

    def __init__(self, module: nn.Module) -> None:
        self.original = module.forward
        self.modules = list(module.modules())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.original(*args, **kwargs)
        return checkpoint(self.original, *args, use_reentrant=False, context_fn=_context_fn(self.modules), **kwargs)


def is_recomputed(module: nn.Module) -> bool:
    """True when ``module``'s forward runs under recompute."""
    return isinstance(module.__dict__.get("forward"), _RecomputedForward)


def resolve_checkpoints(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    """The submodules of ``model`` named in ``names``; KeyError (valid names, closest match) or ValueError if bad."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"recompute checkpoints must be a list of submodule names, got {names!r}")
    if not names:
        children = [n for n, _ in model.named_children()][:6]
        raise ValueError("strategy.recompute is True but recompute_configs['checkpoints'] is empty; list the "
                         f"submodules to recompute, e.g. recompute_configs = {{'checkpoints': {children}}}")
    available = {n: m for n, m in model.named_modules() if n}
    targets = []
    for name in names:
        if name not in available:
            close = difflib.get_close_matches(name, list(available), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            shown = ", ".join(list(available)[:30]) + (" ..." if len(available) > 30 else "")
            raise KeyError(f"recompute checkpoint {name!r} is not a submodule of {type(model).__name__}.{hint} "
                           f"Submodules: {shown}")
        targets.append(available[name])
    return targets


def apply_recompute(model: nn.Module, names: Sequence[str]) -> nn.Module:
    """Make the submodules of ``model`` named in ``names`` (``named_modules`` paths) recompute in backward.

    Parameters, buffers and ``state_dict`` keys are untouched. Unknown names
    raise KeyError listing the valid ones, before anything is changed.
    """
    for module in resolve_checkpoints(model, names):
        if not is_recomputed(module):
            module.forward = _RecomputedForward(module)
    return model


def remove_recompute(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_recompute` on every submodule of ``model``."""
    for module in model.modules():
        if is_recomputed(module):
            del module.forward
    return model
