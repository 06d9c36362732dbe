"""The Trainer's full training state: what a checkpoint holds (the entries, built and checked here).

Checkpoint entries (see :mod:`fleetlite.checkpoint` for the file format):

``model`` (unprefixed state_dict) · ``optimizer`` · ``scaler`` (amp) ·
``data`` (the training data's position) · ``progress`` (epoch, batch in
epoch, whether the epoch finished, global step: ``FitState.state_dict``) ·
``ranks`` (per rank: RNG states now and at the start of the epoch, partial
sums of the epoch's training loss and metrics: ``FitState.rank_state_dict``) ·
``world_size`` · ``callbacks`` (each callback's state; LR schedulers are
inside their ``LRScheduler``) · ``strategy`` · ``config`` · ``meta``.

Writing and putting back: :class:`~fleetlite.trainer.checkpoint_connector.CheckpointConnector`
(Note [resume order]).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..checkpoint import CheckpointError
from ..distributed import collective

__all__ = ["build_state", "model_state", "full_weights", "load_model_state", "check_finite", "optimizer_name",
           "REQUIRED"]

REQUIRED = ("model", "progress", "ranks", "world_size", "callbacks")


def build_state(trainer, weights: bool = True, optimizer: bool = True) -> dict[str, Any] | None:
    """The whole training state; collective (every rank calls it), the dict is returned on rank 0 only.

    ``weights``/``optimizer`` False leave ``model``/``optimizer`` None (a sharded checkpoint holds them).
    """
    ranks = collective.all_gather_object(trainer.fit_state.rank_state_dict(trainer.metrics))
    optimizer = trainer.optimizer.state_dict() if optimizer and trainer.optimizer is not None else None  # collective
    model = model_state(trainer) if weights else None  # collective if sharded
    if collective.get_rank() != 0:
        return None
    amp = getattr(trainer.optimizer, "amp", None)
    state = {
        "model": model,
        "optimizer": optimizer,
        "scaler": amp.state_dict() if amp is not None and amp.uses_scaler else None,
        "data": trainer.fit_state.data_position(),
        "progress": trainer.fit_state.state_dict(),
        "ranks": ranks,
        "world_size": collective.get_world_size(),
        "callbacks": trainer.callbacks.state_dict() if trainer.callbacks is not None else {},
        "strategy": None if trainer.strategy is None else trainer.strategy.to_dict(),
        "config": trainer.config,
        "meta": {"time": time.time(), "torch": str(torch.__version__), "fleetlite": __version__,
                 "optimizer": optimizer_name(trainer.user_optimizer)},
    }
    return state


def model_state(trainer, rank0_only: bool = True) -> dict[str, Any]:
    """The model's full unprefixed state; collective for a sharded (stage 2/3) model (then gathered on rank 0
    only unless ``rank0_only=False``)."""
    net = trainer.parallel_network
    return trainer.network.state_dict() if net is None else net.full_state_dict(rank0_only=rank0_only)


def full_weights(trainer) -> dict[str, torch.Tensor]:
    """A copy of the model's full unprefixed state on every rank (collective for a sharded model)."""
    weights = model_state(trainer, rank0_only=False)
    live = {(t.to_local() if hasattr(t, "to_local") else t).data_ptr()
            for t in trainer.network.state_dict().values() if torch.is_tensor(t)}
    # gathered shards are new tensors already; what still aliases the model (plain tensors, buffers) is copied
    return {k: v.detach().clone() if v.data_ptr() in live else v for k, v in weights.items()}


def load_model_state(trainer, weights: dict[str, Any], strict: bool = True) -> None:
    """Load a full state into the model (into the shards of a sharded model; every rank holds ``weights``)."""
    net = trainer.parallel_network
    if net is None:
        trainer.network.load_state_dict(weights, strict=strict)
    else:
        net.load_full_state_dict(weights, strict=strict)


def optimizer_name(optimizer: Any) -> str | None:
    """``"torch.optim.adam.Adam"``: the class of the torch optimizer that steps (inside any wrapper)."""
    if optimizer is None:
        return None
    inner = getattr(optimizer, "inner_opt", optimizer)
    return f"{type(inner).__module__}.{type(inner).__qualname__}"


def check_finite(weights: dict[str, Any], path: Path) -> None:
    """Refuse (``CheckpointError``) weights holding NaN/inf: such a checkpoint never replaces ``latest.pt``."""
    bad = [k for k, v in weights.items()
           if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(path, f"not written: non-finite weights (NaN/inf) in {bad[:5]}"
                                    f"{' ...' if len(bad) > 5 else ''}; training diverged, and latest.pt keeps "
                                    "pointing at the last finite checkpoint. Add fleetlite.callbacks.TerminateOnNaN "
                                    "to stop at the first non-finite loss; try a lower learning rate")
