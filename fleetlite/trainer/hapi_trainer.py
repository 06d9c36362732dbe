"""``HapiTrainer``: the Trainer that runs a ``fleetlite.Model`` (Paddle's batch split, loss call, evaluation
schedule, summed accumulation and ``Model.save``/``load`` files), through the Trainer's overridables.

Not public: ``fleetlite.Model(net).trainer`` is one.

Example::

    t = HapiTrainer(net, n_inputs=1)      # batches split as Paddle's Model(net, inputs=[spec]) does
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .hapi_io import PaddleFiles
from .labels import class_index_labels
from .trainer import Trainer

__all__ = ["HapiTrainer", "to_list"]


def to_list(x: Any) -> list:
    """``x`` as a list: None -> ``[]``, a tuple/list -> a list, anything else -> ``[x]``."""
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _n_forward_inputs(network: nn.Module) -> int | None:
    """Positional parameters of ``forward`` (Paddle: one input per argument name), None with ``*args``."""
    try:
        params = inspect.signature(network.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    n = 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            n += 1
    return n


class HapiTrainer(Trainer):
    """The Trainer that runs a :class:`Model`: Paddle's batch split, loss call, evaluation schedule and summed
    gradient accumulation, through the Trainer's documented overridables. Callbacks see it as ``self.model``
    / ``self.trainer``, so it answers as Paddle's Model does there: ``save``/``load`` write and read Paddle's
    files, and ``_optimizer``, ``_loss``, ``_metrics``, ``network`` and ``stop_training`` are there."""

    merge_avg = False  # Paddle sums the gradients of merged (accumulated) batches

    def __init__(self, network: nn.Module, n_inputs: int | None) -> None:
        super().__init__(network)
        self._n_inputs = n_inputs

    @property
    def _optimizer(self):
        return self.user_optimizer

    @property
    def _loss(self):
        return self.loss_fn

    @property
    def _metrics(self):
        return self.metrics

    def split_batch(self, batch: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """Paddle's split: the first ``len(inputs)`` fields are inputs, the rest labels."""
        data = list(batch) if isinstance(batch, (list, tuple)) else [batch]
        n = self._n_inputs if self._n_inputs is not None else _n_forward_inputs(self.network)
        if n is None or n >= len(data) and len(data) > 1:
            return super().split_batch(batch)
        return tuple(data[:n]), tuple(data[n:])

    def compute_loss(self, outputs: Any, labels: Sequence[Any]) -> torch.Tensor:
        """Paddle: ``loss(*outputs, *labels)``; a loss returning several values is summed. Paddle's ``[N, 1]``
        integer labels reach torch's ``CrossEntropyLoss``/``NLLLoss`` (``F.cross_entropy``/``F.nll_loss``) as
        ``[N]`` class indices (:func:`class_index_labels`), as Paddle's loss accepts them."""
        labels = class_index_labels(self.loss_fn, outputs, labels)
        losses = to_list(self.loss_fn(*to_list(outputs), *labels))
        return losses[0] if len(losses) == 1 else torch.stack([torch.as_tensor(v).sum() for v in losses]).sum()

    def eval_due(self, epoch: int, eval_freq: int) -> bool:
        """Paddle: evaluate after epochs with ``epoch % eval_freq == 0``."""
        return epoch % eval_freq == 0

    # Paddle's callbacks call ``self.model.save(path)``/``load``: here they get Paddle's files, as from the Model
    def save(self, path: str | os.PathLike, training: bool = True) -> Any:
        """Paddle's ``Model.save`` with ``training=True`` (``{path}.pdparams``/``.pdopt``); else the Trainer's."""
        if training:
            return PaddleFiles(self).save(os.fspath(path))
        return Trainer.save(self, path, training=False)

    def load(self, path: str | os.PathLike, skip_mismatch: bool = False, reset_optimizer: bool = False) -> Any:
        """Paddle's ``Model.load`` (``.pdparams``/``.pdopt``; a ``.pt`` through the Trainer's loader)."""
        return PaddleFiles(self).load(os.fspath(path), skip_mismatch, reset_optimizer,
                                      other=lambda p, skip, reset: Trainer.load(self, p, skip, reset))
