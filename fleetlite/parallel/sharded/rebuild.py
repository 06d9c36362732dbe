"""Rebuilding a torch optimizer of the same class and settings over other parameters.

Stage 1 hands the optimizer's class and constructor arguments to
``ZeroRedundancyOptimizer``; stages 2/3 rebuild the optimizer over the
sharded (DTensor) parameters that ``fully_shard`` puts in place of the
originals. ``optimizer.defaults`` cannot be passed back as keyword arguments
as such: some optimizers keep keys there that their constructor does not take
(torch's AdamW stores ``decoupled_weight_decay``), so only the names the
constructor accepts are passed (all of them when it takes ``**kwargs``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["constructor_kwargs", "rebuild_optimizer", "report_steps_to", "groups_kept"]


def report_steps_to(original: torch.optim.Optimizer, replacement: torch.optim.Optimizer) -> None:
    """Mark ``original`` as stepped whenever ``replacement`` steps, so an LR scheduler built on the original
    (whose parameter groups the replacement shares) does not warn that the optimizer never stepped."""
    replacement.register_step_post_hook(lambda *_: setattr(original, "_opt_called", True))


@contextlib.contextmanager
def groups_kept(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Load state into ``optimizer`` inside this block and its parameter-group dicts stay the same objects.

    # Note [shared parameter groups]
    Stage 1's ``ZeroRedundancyOptimizer`` and the optimizer rebuilt over stage 2/3's shards hold the very
    parameter-group dicts of the optimizer the user built, so an LR scheduler built on that optimizer drives
    the one that trains. ``Optimizer.load_state_dict`` (and DCP's ``set_optimizer_state_dict``, which calls
    it) installs new group dicts, which would leave the scheduler stepping dicts nothing reads: the learning
    rate would freeze at its restored value. Every load of such an optimizer runs inside this block, which
    copies the loaded groups into the original dicts and puts those back.
    """
    kept = list(optimizer.param_groups)
    yield
    loaded = optimizer.param_groups
    for i, (old, new) in enumerate(zip(kept, loaded)):
        if old is not new:
            old.clear()
            old.update(new)
            loaded[i] = old


def constructor_kwargs(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The entries of ``optimizer.defaults`` that ``type(optimizer)(params, **kwargs)`` accepts."""
    try:
        sig = inspect.signature(type(optimizer).__init__)
    except (TypeError, ValueError):  # a C-implemented or odd constructor: pass everything
        return dict(optimizer.defaults)
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in params}


def rebuild_optimizer(optimizer: torch.optim.Optimizer,
                      new_param: Callable[[torch.nn.Parameter], torch.nn.Parameter]) -> torch.optim.Optimizer:
    """A fresh optimizer of ``optimizer``'s class over ``new_param(p)`` for each of its parameters.

    The parameter-group dicts are reused (their ``"params"`` replaced), so an
    LR scheduler built on the original optimizer still drives the new one's
    learning rates. The optimizer must not have stepped yet (its state would
    be lost): raises ``ValueError`` otherwise.
    """
    if any(s.get("step") is not None and float(torch.as_tensor(s["step"])) > 0 for s in optimizer.state.values()):
        raise ValueError(f"the {type(optimizer).__name__} optimizer has already stepped; sharding rebuilds it over "
                         "the sharded parameters, so wrap it before the first step and load checkpoints after")
    groups = optimizer.param_groups
    for group in groups:
        group["params"] = [new_param(p) for p in group["params"]]
    new = type(optimizer)(groups, **constructor_kwargs(optimizer))
    report_steps_to(optimizer, new)
    return new
