"""The progress of a fit in one object (Lightning's loop progress): :class:`FitState`.

The loops (:mod:`~fleetlite.trainer.loops`) move it forward, the checkpoint
connector (:mod:`~fleetlite.trainer.checkpoint_connector`) saves and loads it, and callbacks read
it through the Trainer's read-only properties (``trainer.epoch``,
``trainer.global_step``, ``trainer.at_step_boundary``...). Its checkpoint
entries are ``progress`` (:meth:`FitState.state_dict`) and, per rank, the RNG
states and the epoch's partial sums (:meth:`FitState.rank_state_dict`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..checkpoint import capture_rng_state

__all__ = ["FitState"]


def _zero() -> torch.Tensor:
    return torch.zeros((), dtype=torch.float64)


@dataclass
class FitState:
    """Counters, running sums and data position of a fit, with ``state_dict``/``load_state_dict``.

    Example::

        state = FitState()
        state.start_epoch(0, metrics=[])
        state.add_batch(torch.tensor(0.5), 32)
        state.state_dict()   # {'epoch': 0, 'batch_in_epoch': 0, 'global_step': 0, ...}
    """

    epoch: int = 0
    global_step: int = 0  # optimizer steps
    batch_in_epoch: int = 0  # batches of the running epoch done (a resumed epoch counts its earlier ones)
    epoch_finished: bool = False
    at_step_boundary: bool = True  # the running batch ends a gradient-merge window (the optimizer steps)
    pass_index: int = 0  # batches of the running pass done (a resumed epoch's pass starts at 0)
    batch_valid: int = 0  # real (non-padding) samples of the running batch
    fitting: bool = False
    accumulate: int = 1  # micro-batches per optimizer step in the running fit
    epoch_rng: dict[str, Any] | None = None  # RNG states at the start of the epoch (Note [resume order])
    loss_sum: torch.Tensor = field(default_factory=_zero)  # the epoch's training loss, weighted by batch size
    count: int = 0
    adapter: Any = None  # the training data of the running (or last) fit: its position is checkpointed
    pending_saves: list[Callable[[], None]] = field(default_factory=list)  # Note [checkpoint timing]

    # -- the epoch's running sums --------------------------------------------------------------------------------
    def reset_sums(self, metrics) -> None:
        self.loss_sum, self.count = _zero(), 0
        for m in metrics:
            m.reset()

    def add_batch(self, loss: torch.Tensor, n: int) -> torch.Tensor:
        """Add a batch's mean loss (weight ``n``) to the sums; returns the running mean (a device tensor)."""
        # the sums stay on the loss's device: no device sync per step (read at log time / epoch end)
        self.loss_sum = self.loss_sum.to(loss.device) + loss.detach().to(torch.float64) * n
        self.count += n
        return self.loss_sum / max(self.count, 1)

    def sums(self) -> torch.Tensor:
        """``[loss_sum, count]`` on the CPU (a device sync), to reduce across ranks."""
        return torch.tensor([float(self.loss_sum), float(self.count)], dtype=torch.float64)

    # -- epochs ------------------------------------------------------------------------------------------------
    def start_epoch(self, epoch: int, metrics) -> None:
        """Enter ``epoch`` afresh: counters and sums at zero, the epoch-start RNG states captured."""
        self.epoch, self.epoch_finished, self.batch_in_epoch = epoch, False, 0
        self.reset_sums(metrics)
        self.epoch_rng = capture_rng_state()

    def resume_epoch(self, epoch: int, metrics, sums: dict[str, Any], epoch_rng: dict[str, Any] | None) -> None:
        """Re-enter an epoch saved midway: its partial sums and epoch-start RNG states (Note [resume order])."""
        self.epoch, self.epoch_finished = epoch, False
        self.reset_sums(metrics)
        self.loss_sum, self.count = torch.tensor(sums["loss_sum"], dtype=torch.float64), int(sums["count"])
        for m, s in zip(metrics, sums.get("metrics") or []):
            m.load_state_dict(s)
        self.epoch_rng = epoch_rng

    @property
    def pass_done(self) -> bool:
        """Every batch of the running pass has been consumed (its epoch only lacks its end)."""
        a = self.adapter
        return bool(a is not None and self.fitting and a.length() is not None and self.pass_index >= a.length())

    def data_position(self) -> dict[str, Any] | None:
        """The training data's position (a sampler cursor), or None when the data cannot say it."""
        a = self.adapter
        return a.position(self.pass_index) if a is not None and a.resumable else None

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's ``progress`` entry."""
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "epoch_finished": self.epoch_finished,
                "pass_done": self.pass_done, "global_step": self.global_step,
                "accumulate_grad_batches": self.accumulate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.global_step = int(state["epoch"]), int(state["global_step"])
        self.batch_in_epoch, self.epoch_finished = int(state["batch_in_epoch"]), bool(state["epoch_finished"])

    def rank_state_dict(self, metrics) -> dict[str, Any]:
        """This rank's entry of the checkpoint's ``ranks``: RNG states now and at the epoch start, partial sums."""
        return {"rng": capture_rng_state(), "epoch_rng": self.epoch_rng,
                "train_accum": {"loss_sum": float(self.loss_sum), "count": int(self.count),
                                "metrics": [m.state_dict() for m in metrics]}}
