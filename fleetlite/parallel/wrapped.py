"""What a loop sees of a model ``fleet.distributed_model`` returned: the :class:`WrappedModel` protocol.

:class:`~fleetlite.DataParallel` (both faces: Paddle's and DDP's),
:class:`~fleetlite.parallel.sharded.ShardedDataParallel` (stages 2/3, HSDP)
and, later, the hybrid wrappers declare it, so the Trainer asks the model
instead of testing which class it is or which attributes it happens to have.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from .comm import broadcast_coalesced

__all__ = ["WrappedModel", "StateLayout"]


@dataclass(frozen=True)
class StateLayout:
    """How this rank's model state sits in the single-process model's, as a checkpoint needs it.

    ``partial``: no rank holds the whole state (tensor-parallel slices, one pipeline stage), so it is checkpointed
    as a DCP directory of every rank's parts, and a checkpoint file's whole-tensor optimizer state cannot be
    loaded into it; ``degrees``: the ``{"dp", "mp", "pp"}`` a checkpoint records (sharding and sep in dp).

    Example::

        model.state_layout()       # StateLayout(partial=False, degrees={'dp': 2, 'mp': 1, 'pp': 1}) under DDP
    """

    partial: bool
    degrees: dict[str, int]

    @staticmethod
    def whole() -> StateLayout:
        """Every rank holds the whole model (data parallel, sharding's gathered view): dp over every rank."""
        world = tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1
        return StateLayout(False, {"dp": world, "mp": 1, "pp": 1})


class WrappedModel(nn.Module):
    """A model wrapped for distributed training.

    ``module`` is the plain model; ``is_sharded`` says whether its parameters are sharded across ranks
    (then a forward is collective: every rank must run as many; and the full weights must be gathered,
    collectively); ``full_state_dict`` / ``load_full_state_dict`` move the full, unprefixed weights;
    ``agree_buffers`` gives every rank rank 0's buffers; ``step_runner`` names the Trainer's step runner for
    this model (``"default"``, ``"pipeline"``) or is a factory ``(trainer, model) -> runner`` (Note [step
    runners] in ``fleetlite.trainer.steps``), so the Trainer asks the model how its batches run;
    ``state_layout`` says how a rank's state sits in the full model's (:class:`StateLayout`), so the Trainer's
    checkpoints ask the model instead of testing whether it is tensor- or pipeline-parallel.
    """

    is_sharded: bool = False
    group: Any = None  # the process group (None: the world)
    step_runner: Any = "default"  # the Trainer's steps: a whole-model forward on every rank

    @property
    def module(self) -> nn.Module:  # pragma: no cover - every wrapper defines it
        raise NotImplementedError

    def full_state_dict(self, rank0_only: bool = False) -> dict[str, torch.Tensor]:
        """The full, unprefixed state (collective when sharded; ``rank0_only``: other ranks may get ``{}``)."""
        return self.module.state_dict()

    def load_full_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Load a full, unprefixed state (every rank passes it; a sharded model keeps its shards of it)."""
        return self.module.load_state_dict(state_dict, strict=strict)

    def state_layout(self) -> StateLayout:
        """How this rank's state sits in the full model's (:class:`StateLayout`): whole on every rank here."""
        return StateLayout.whole()

    def agree_buffers(self) -> None:
        """Give every rank rank 0's buffers (BatchNorm statistics...), coalesced (collective)."""
        if not (tdist.is_available() and tdist.is_initialized()) or tdist.get_world_size(self.group) == 1:
            return
        buffers = list(self.module.buffers())
        if buffers:
            broadcast_coalesced(buffers, self.group)
