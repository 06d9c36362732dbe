"""The progress of a fit in one object (Lightning's loop progress): :class:`FitProgress`, inside :class:`FitState`.

The fit loop (:mod:`~fleetlite.trainer.fit_loop`) moves it forward, the checkpoint
connector (:mod:`~fleetlite.trainer.checkpoint_connector`) saves and loads it, and callbacks read
it through the Trainer's read-only properties (``trainer.epoch``,
``trainer.global_step``, ``trainer.at_step_boundary``...). Its checkpoint
entries are ``progress`` (:meth:`FitProgress.state_dict`: its fields, so saving
and loading cannot drift apart) and, per rank, the RNG states and the epoch's
partial sums (:meth:`FitState.rank_state_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ..checkpoint import capture_rng_state

__all__ = ["FitProgress", "FitState"]


def _zero() -> torch.Tensor:
    return torch.zeros((), dtype=torch.float64)


@dataclass
class FitProgress:
    """The counters a checkpoint's ``progress`` entry holds: ``state_dict`` is exactly these fields.

    Example::

        p = FitProgress(epoch=2, global_step=7)
        FitProgress().load_state_dict(p.state_dict())   # every field back
    """

    epoch: int = 0
    global_step: int = 0  # optimizer steps
    batch_in_epoch: int = 0  # batches of the running epoch done (a resumed epoch counts its earlier ones)
    epoch_finished: bool = False
    pass_done: bool = False  # every batch of the running pass consumed (its epoch only lacks its end)
    accumulate_grad_batches: int = 1  # micro-batches per optimizer step in the running fit

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's ``progress`` entry: the fields of :class:`FitProgress`, by name."""
        return {f.name: getattr(self, f.name) for f in fields(FitProgress)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set every field :meth:`state_dict` wrote (a field it lacks keeps its value)."""
        for f in fields(FitProgress):
            if f.name in state:
                setattr(self, f.name, type(getattr(self, f.name))(state[f.name]))


@dataclass
class FitState(FitProgress):
    """A fit's :class:`FitProgress` plus what the running fit keeps that no checkpoint holds as such: the step
    boundary, the position in the running pass, the epoch's running sums (a checkpoint keeps them per rank,
    :meth:`rank_state_dict`), the training data.

    Example::

        state = FitState()
        state.start_epoch(0, metrics=[])
        state.add_batch(torch.tensor(0.5), 32)
        state.state_dict()   # {'epoch': 0, 'global_step': 0, 'batch_in_epoch': 0, ...}
    """

    at_step_boundary: bool = True  # the running batch ends a gradient-merge window (the optimizer steps)
    pass_index: int = 0  # batches of the running pass done (a resumed epoch's pass starts at 0)
    batch_valid: int = 0  # real (non-padding) samples of the running batch
    fitting: bool = False
    epoch_rng: dict[str, Any] | None = None  # RNG states at the start of the epoch (Note [resume order])
    loss_sum: torch.Tensor = field(default_factory=_zero)  # the epoch's training loss, weighted by batch size
    count: int = 0
    adapter: Any = None  # the training data of the running (or last) fit: its position is checkpointed

    @property
    def accumulate(self) -> int:
        """Micro-batches per optimizer step in the running fit (``accumulate_grad_batches``)."""
        return self.accumulate_grad_batches

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
        self.epoch, self.epoch_finished, self.batch_in_epoch, self.pass_done = epoch, False, 0, False
        self.reset_sums(metrics)
        self.epoch_rng = capture_rng_state()

    def resume_epoch(self, epoch: int, metrics, sums: dict[str, Any], epoch_rng: dict[str, Any] | None) -> None:
        """Re-enter an epoch saved midway: its partial sums and epoch-start RNG states (Note [resume order])."""
        self.epoch, self.epoch_finished, self.pass_done = epoch, False, False
        self.reset_sums(metrics)
        self.loss_sum, self.count = torch.tensor(sums["loss_sum"], dtype=torch.float64), int(sums["count"])
        for m, s in zip(metrics, sums.get("metrics") or []):
            m.load_state_dict(s)
        self.epoch_rng = epoch_rng

    def data_position(self) -> dict[str, Any] | None:
        """The training data's position (a sampler cursor), or None when the data cannot say it."""
        a = self.adapter
        return a.position(self.pass_index) if a is not None and a.resumable else None

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def rank_state_dict(self, metrics) -> dict[str, Any]:
        """This rank's entry of the checkpoint's ``ranks``: RNG states now and at the epoch start, partial sums."""
        return {"rng": capture_rng_state(), "epoch_rng": self.epoch_rng,
                "train_accum": {"loss_sum": float(self.loss_sum), "count": int(self.count),
                                "metrics": [m.state_dict() for m in metrics]}}
