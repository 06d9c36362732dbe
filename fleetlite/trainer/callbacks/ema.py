"""``EMA``: an exponential moving average of the weights, on ``torch.optim.swa_utils``.

The average is an ``AveragedModel`` of the *plain* network (``trainer.network``,
never the data-parallel wrapper, so no engine state is copied) updated with
``get_ema_multi_avg_fn(decay)`` after every optimizer step that really
stepped (an amp step skipped for overflow is not averaged). Every rank holds
the same weights after a step, so every rank's average is the same. Its
state (weights, buffers, ``n_averaged``) goes into checkpoints, so a resumed
run continues the average bit for bit.

# Note [EMA under sharding]
A network sharded by stage 2/3 (FSDP2 ``fully_shard``) cannot be deep-copied, so ``AveragedModel`` cannot hold
it. There the EMA is of the *full* weights: after each optimizer step every rank gathers them
(``trainer.get_weights()``, a collective all ranks join from this callback's hooks) and averages them with the
same ``get_ema_multi_avg_fn`` arithmetic, grouped by device and dtype as ``AveragedModel`` does, so the average
equals the unsharded (data-parallel) run's bit for bit. The price: one all-gather per optimizer step and a
full copy of the weights on every rank. In exchange the average is the same on every rank, its state (the
``AveragedModel`` layout: ``module.<name>`` and ``n_averaged``) is the same as an unsharded run's in a checkpoint
written by rank 0, and ``copy_to``/``eval_with_ema`` put it into the shards through ``trainer.set_weights``.

Example::

    ema = EMA(decay=0.999, eval_with_ema=True)     # validation in fit uses the averaged weights
    trainer.fit(data, eval_data=val, epochs=5, callbacks=[ema])
    ema.copy_to(trainer.network)                   # keep the averaged weights
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from .base import Callback

__all__ = ["EMA"]


def _set_full_weights(network: torch.nn.Module, set_weights, weights: dict[str, torch.Tensor]) -> None:
    """``set_weights(weights)`` (the Trainer's) into a sharded ``network`` (collective). Stage 2 keeps the
    parameters unsharded after a forward without backward (an evaluation), and loading a full state into them
    fails ("mixed torch.Tensor and DTensor"): reshard first (``FSDPModule.reshard``, torch's public API)."""
    for m in network.modules():
        reshard = getattr(m, "reshard", None)
        if callable(reshard) and type(m).__name__.startswith("FSDP"):
            reshard()
    set_weights(dict(weights))


class _FullAverage:
    """``AveragedModel``'s EMA on the full weights of a sharded network (Note [EMA under sharding]): the same
    ``update_parameters`` rules (the first update copies; ``use_buffers`` averages the buffers, else copies them)
    and the same ``state_dict`` layout (``module.<name>``, ``n_averaged``)."""

    def __init__(self, weights: dict[str, torch.Tensor], param_names: set[str], decay: float,
                 use_buffers: bool) -> None:
        self.weights = {k: v.detach().clone() for k, v in weights.items()}
        self.param_names = param_names
        self.avg_fn = get_ema_multi_avg_fn(decay)
        self.use_buffers = use_buffers
        self.n_averaged = torch.tensor(0, dtype=torch.long)

    @property
    def module(self) -> SimpleNamespace:
        """``.module.state_dict()``: the averaged full weights (as ``AveragedModel.module``)."""
        return SimpleNamespace(state_dict=lambda: dict(self.weights))

    def update(self, current: dict[str, torch.Tensor]) -> None:
        averaged = [k for k in self.weights if self.use_buffers or k in self.param_names]
        if self.n_averaged == 0:
            for k in averaged:
                self.weights[k].copy_(current[k])
        else:
            groups: dict[tuple, list[str]] = {}
            for k in averaged:
                groups.setdefault((self.weights[k].device, self.weights[k].dtype), []).append(k)
            for keys in groups.values():
                self.avg_fn([self.weights[k] for k in keys], [current[k].to(self.weights[k].device) for k in keys],
                            self.n_averaged)
        if not self.use_buffers:
            for k in self.weights:
                if k not in self.param_names:
                    self.weights[k].copy_(current[k])
        self.n_averaged += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**{f"module.{k}": v for k, v in self.weights.items()}, "n_averaged": self.n_averaged}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in self.weights.items():
            v.copy_(state[f"module.{k}"])
        self.n_averaged = torch.as_tensor(state["n_averaged"]).clone()


class EMA(Callback):
    """Keep an exponential moving average of the model's weights (see the module docstring).

    Args:
        decay: the EMA decay (``avg = decay * avg + (1 - decay) * weights``), in ``[0, 1)``.
        use_buffers: average the buffers too (BatchNorm statistics), as ``AveragedModel(use_buffers=True)``.
        eval_with_ema: evaluate inside ``fit`` with the averaged weights (the training weights are put back
            afterwards).

    Example::

        ema = EMA(0.99)
        trainer.fit(data, epochs=3, callbacks=[ema])
        trainer.evaluate(val, callbacks=[ema.evaluating()])   # one evaluation with the EMA weights
    """

    def __init__(self, decay: float = 0.999, use_buffers: bool = True, eval_with_ema: bool = False) -> None:
        super().__init__()
        if not 0.0 <= float(decay) < 1.0:
            raise ValueError(f"EMA(decay={decay!r}) must be in [0, 1)")
        self.decay = float(decay)
        self.use_buffers = use_buffers
        self.eval_with_ema = eval_with_ema
        self.averaged: Any = None
        self._saved: dict[str, torch.Tensor] | None = None
        self._pending_state: dict[str, Any] | None = None

    def _build(self) -> None:
        t = self.trainer
        if self.averaged is None and t.parallel_network.is_sharded:  # Note [EMA under sharding]
            names = {n for n, _ in t.network.named_parameters()}
            self.averaged = _FullAverage(t.get_weights(), names, self.decay, self.use_buffers)
        elif self.averaged is None:
            self.averaged = AveragedModel(self.trainer.network, multi_avg_fn=get_ema_multi_avg_fn(self.decay),
                                          use_buffers=self.use_buffers)
        if self._pending_state is not None:
            self.averaged.load_state_dict(self._pending_state)
            self._pending_state = None

    def on_train_begin(self, logs=None):
        self._build()

    def on_train_batch_end(self, step, logs=None):
        t = self.trainer
        if not (t.at_step_boundary and getattr(t.optimizer, "stepped", True)):
            return
        if isinstance(self.averaged, _FullAverage):
            self.averaged.update(t.get_weights())  # collective: every rank runs this hook
        else:
            self.averaged.update_parameters(t.network)

    # -- evaluation with the averaged weights ----------------------------------------------------------------
    def _swap_in(self) -> None:
        t = self.trainer
        if isinstance(self.averaged, _FullAverage):
            self._saved = t.get_weights()  # collective (eval hooks run on every rank)
            _set_full_weights(t.network, t.set_weights, self.averaged.weights)
            return
        net = t.network
        self._saved = {k: v.detach().clone() for k, v in net.state_dict().items()}
        self.copy_to(net)

    def _swap_out(self) -> None:
        if self._saved is not None and isinstance(self.averaged, _FullAverage):
            _set_full_weights(self.trainer.network, self.trainer.set_weights, self._saved)
            self._saved = None
        elif self._saved is not None:
            with torch.no_grad():
                for k, v in self.trainer.network.state_dict().items():
                    v.copy_(self._saved[k])
            self._saved = None

    def on_eval_begin(self, logs=None):
        if self.eval_with_ema and self.averaged is not None:
            self._swap_in()

    def on_eval_end(self, logs=None):
        self._swap_out()

    def evaluating(self) -> EMA:
        """A copy of this callback that evaluates with the averaged weights (for ``trainer.evaluate``)."""
        view = EMA(self.decay, self.use_buffers, eval_with_ema=True)
        view.averaged = self.averaged
        return view

    def copy_to(self, module: nn.Module) -> None:
        """Copy the averaged weights (and buffers) into ``module`` in place. Under sharding stage 2/3 the
        trainer's own (sharded) network is loaded through ``trainer.set_weights`` (collective: call it on every
        rank); a plain module gets the full averaged weights on any rank."""
        if self.averaged is None:
            raise RuntimeError("EMA has no average yet: it starts when fit runs with this callback")
        if isinstance(self.averaged, _FullAverage) and self.trainer is not None and module is self.trainer.network:
            _set_full_weights(self.trainer.network, self.trainer.set_weights, self.averaged.weights)
            return
        src = self.averaged.module.state_dict()
        with torch.no_grad():
            for k, v in module.state_dict().items():
                v.copy_(src[k])

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.averaged is None:
            return {}
        return {"averaged": {k: v.detach().cpu().clone() for k, v in self.averaged.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "averaged" not in state:
            return
        if self.averaged is None:
            self._pending_state = state["averaged"]
        else:
            self.averaged.load_state_dict(state["averaged"])
