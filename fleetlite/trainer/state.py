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
from ..utils.user_warning import warn_user

__all__ = ["build_state", "model_state", "rank_entry", "full_weights", "load_model_state", "check_optimizer",
           "check_finite", "optimizer_name", "REQUIRED"]

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


def check_optimizer(path: str | Path, state: dict[str, Any], optimizer: Any, hint: str) -> None:
    """Refuse, naming both, a checkpoint whose optimizer state comes from another optimizer class.

    torch would load such a state silently and fail at the first step (``KeyError: 'momentum'``). Checkpoints
    that do not record the class are checked by their hyperparameter names.
    """
    saved_opt = state.get("optimizer")
    if optimizer is None or not isinstance(saved_opt, dict):
        return
    saved = (state.get("meta") or {}).get("optimizer")
    mine = optimizer_name(optimizer)

    def short(name: Any) -> str:
        return str(name).rsplit(".", 1)[-1]

    if saved is not None and saved != mine:
        raise CheckpointError(path, f"its optimizer state comes from {short(saved)} ({saved}) but this run's "
                                    f"optimizer is {short(mine)} ({mine}); {hint}")
    groups = saved_opt.get("param_groups") or []
    own = getattr(optimizer, "inner_opt", optimizer).param_groups
    if saved is None and groups and own:
        missing = sorted(set(own[0]) - set(groups[0]) - {"params"})
        if missing:
            raise CheckpointError(path, f"its optimizer state lacks the hyperparameters {missing} of this run's "
                                        f"optimizer {short(mine)} ({mine}): it was written by another optimizer "
                                        f"class; {hint}")


def check_finite(weights: dict[str, Any], path: Path) -> None:
    """Refuse (``CheckpointError``) weights holding NaN/inf: such a checkpoint never replaces ``latest.pt``."""
    bad = [k for k, v in weights.items()
           if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(path, f"not written: non-finite weights (NaN/inf) in {bad[:5]}"
                                    f"{' ...' if len(bad) > 5 else ''}; training diverged, and latest.pt keeps "
                                    "pointing at the last finite checkpoint. Add fleetlite.callbacks.TerminateOnNaN "
                                    "to stop at the first non-finite loss; try a lower learning rate")


def rank_entry(state: dict[str, Any], rank: int, world_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(RNG entry, training partial sums) for ``rank``; on another world size all sums go to rank 0."""
    ranks = state["ranks"]
    saved_world = int(state["world_size"])
    if saved_world == world_size:
        entry = ranks[rank]
        return entry, entry["train_accum"]
    if rank == 0:
        warn_user(f"fleetlite: resuming a {saved_world}-rank checkpoint on {world_size} ranks: every remaining "
                      "sample of the epoch is still seen once, but random streams (and so results) differ from "
                      "an uninterrupted run")
    entry = ranks[rank % saved_world]
    if rank != 0:
        return entry, {"loss_sum": 0.0, "count": 0, "metrics": None}
    total = {"loss_sum": sum(r["train_accum"]["loss_sum"] for r in ranks),
             "count": sum(r["train_accum"]["count"] for r in ranks), "metrics": None}
    metric_states = [r["train_accum"]["metrics"] for r in ranks]
    if metric_states and metric_states[0]:
        total["metrics"] = [{k: sum(ms[i][k] for ms in metric_states) for k in metric_states[0][i]}
                            for i in range(len(metric_states[0]))]
    return entry, total


