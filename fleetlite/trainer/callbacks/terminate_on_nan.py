"""``TerminateOnNaN``: stop every rank at the same optimizer step when the training loss stops being finite.

Public through :mod:`fleetlite.callbacks`.

# Note [non-finite loss]
Keras' ``TerminateOnNaN`` looks at one process's loss. With several ranks a
NaN may appear on one rank only (one bad sample); its gradients then poison
every rank through the all-reduce, but the other ranks' own losses can stay
finite for that step. So each rank checks its running epoch loss (a NaN
stays in the running mean, nothing is missed between checks) at a step
boundary, and the ranks add their verdicts with one all-reduce of a
``world_size``-long vector (:func:`~fleetlite.distributed.agreement.flags_of_ranks`):
every rank learns at the same step which ranks saw it, and all raise the same
:class:`NonFiniteLossError`.

Nothing in a step waits for the device. The verdict of step N is computed on
the device and copied to pinned host memory without blocking; it is read at
step N+1, after that step's work is queued, by waiting on an event recorded
at step N (the GPU still has step N+1 to run, so it never idles). The lag is
bounded: a non-finite loss at step N stops training after step N+1 at the
latest (with ``check_freq=k``: one step after the first checked step from N
on), on every rank alike (the ranks read the same all-reduced vector at the
same step), and ``trainer.terminated_on_nan`` / the error name step N. Before
any checkpoint is written (the Trainer's fit loop calls :meth:`TerminateOnNaN.before_save`
when saves are requested: a save reads the weights anyway) and at an epoch's and
training's end, the newest verdict is read at once, so a save never follows an
unread verdict: with a checkpoint at step N the stop is at step N itself and
the save is dropped. :meth:`fleetlite.trainer.checkpoint_connector.CheckpointConnector.save`
refuses to point ``latest.pt`` at weights that are not finite in any case.
Cost: one tiny all-reduce every ``check_freq`` optimizer steps, no host sync.
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from ...distributed import collective
from ...distributed.agreement import flags_of_ranks
from .base import Callback, is_rank_zero

__all__ = ["TerminateOnNaN", "NonFiniteLossError"]


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; raised on every rank at the same step by ``TerminateOnNaN``."""

    def __init__(self, message: str, step: int, ranks: list[int]):
        super().__init__(message)
        self.step = step
        self.ranks = ranks


class TerminateOnNaN(Callback):
    """Keras' ``TerminateOnNaN``: stop every rank when the training loss is no longer finite.

    The finiteness flag is agreed across ranks (one tiny all-reduce per
    checked step) and read one optimizer step later without stalling the device
    (see Note [non-finite loss]): a non-finite loss at step N stops every rank
    after step N+1 at the latest, after step N when a checkpoint is due at N
    (or the epoch ends there). ``trainer.terminated_on_nan`` holds step N. The
    checkpoints written before the bad step, ``latest.pt`` included, are kept
    (no checkpoint of the broken weights). As in Keras, ``fit`` then returns;
    ``raise_error=True`` (the recipes' default, through
    ``trainer.callbacks.terminate_on_nan``) raises :class:`NonFiniteLossError`
    on every rank instead, with the step and what to try. Checked every
    ``check_freq`` optimizer steps.

    Example::

        trainer.fit(data, epochs=10, save_dir="runs/a", callbacks=[TerminateOnNaN()])
        trainer.terminated_on_nan    # None, or the optimizer step where the loss went NaN/inf
    """

    def __init__(self, check_freq: int = 1, raise_error: bool = False) -> None:
        super().__init__()
        if isinstance(check_freq, bool) or not isinstance(check_freq, int) or check_freq < 1:
            raise ValueError(f"TerminateOnNaN(check_freq={check_freq!r}) must be a positive integer")
        self.check_freq = check_freq
        self.raise_error = bool(raise_error)
        self._reset()

    def _reset(self) -> None:
        self._slots: list[tuple[torch.Tensor, Any]] = []  # two host buffers (pinned on CUDA) and numpy views
        self._next = 0  # the slot the next verdict goes to
        self._pending: list[_Verdict] = []  # verdicts queued on the device, oldest first
        self._unchecked: tuple[Any, int, int, int] | None = None  # the newest boundary's loss, not yet queued

    # -- the verdicts -----------------------------------------------------------------------------------------
    def _queue(self, loss: Any, where: tuple[int, int, int]) -> None:
        """Start the verdict on ``loss``: computed, agreed and copied to the host without waiting."""
        device = torch.device(self.trainer.device)
        value = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss), device=device)
        bad = ~torch.isfinite(value.to(torch.float64)).all()
        flags = flags_of_ranks(bad, value.device)
        if len(self._slots) != 2 or self._slots[0][0].numel() != flags.numel():
            self._make_slots()  # on_train_begin made them, unless the hooks are driven by hand
        host, view = self._slots[self._next]
        self._next = 1 - self._next
        event = None
        if flags.device.type == "cuda":
            host.copy_(flags, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:  # the CPU: nothing to wait for (another accelerator: a blocking copy)
            host.copy_(flags)
        self._pending.append(_Verdict(view, event, *where))
        self._unchecked = None

    def _settle(self, keep: int = 0) -> None:
        """Read every queued verdict but the newest ``keep``; stop (or raise) at the first non-finite one."""
        while len(self._pending) > keep:
            verdict = self._pending.pop(0)
            ranks = verdict.ranks()
            if ranks:
                self._pending.clear()
                self._stop(verdict, ranks)
                return

    def _stop(self, verdict: _Verdict, ranks: list[int]) -> None:
        t = self.trainer
        t.terminated_on_nan = verdict.step
        t.stop_training = True
        where = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
        message = (f"non-finite loss (NaN or inf) at optimizer step {verdict.step} (epoch {verdict.epoch}, batch "
                   f"{verdict.batch}) on {where}: training stopped on every rank after optimizer step "
                   f"{t.global_step}; checkpoints written before it are kept and latest.pt is never replaced by "
                   "non-finite weights. Try a lower learning rate (e.g. optim.lr), gradient clipping, or float32 "
                   "instead of amp")
        if self.raise_error:
            raise NonFiniteLossError(message, verdict.step, ranks)
        if is_rank_zero():
            print(f"Batch {verdict.batch}: invalid loss, terminating training ({message})")

    def before_save(self) -> None:
        """Read the newest verdict now (checkpoints are about to be written; the fit loop calls this): a save never
        follows a non-finite loss that was not looked at. Collective when a verdict is still to be queued."""
        if self.trainer.terminated_on_nan is not None:
            return
        if self._unchecked is not None:
            loss, *where = self._unchecked
            self._queue(loss, tuple(where))
        self._settle()

    # -- hooks --------------------------------------------------------------------------------------------------
    def _make_slots(self) -> None:
        world = collective.get_world_size() if collective.is_initialized() else 1
        pin = torch.device(self.trainer.device).type == "cuda"
        buffers = (torch.zeros(world, pin_memory=pin), torch.zeros(world, pin_memory=pin))
        self._slots = [(buf, buf.numpy()) for buf in buffers]  # read through numpy: no tensor call per step

    def on_train_begin(self, logs=None):
        self._reset()
        self._make_slots()

    def on_train_batch_end(self, step, logs=None):
        t = self.trainer
        if not t.at_step_boundary or not logs or "loss" not in logs:
            return
        self._unchecked = (logs["loss"], t.global_step, t.epoch, step)
        if t.global_step % self.check_freq == 0:
            self._queue(logs["loss"], (t.global_step, t.epoch, step))
            self._settle(keep=1)  # the previous step's verdict: its event is one step old

    def on_epoch_end(self, epoch, logs=None):
        self.before_save()  # the epoch's logs were read on the host already

    def on_train_end(self, logs=None):
        self.before_save()

    def on_exception(self, error: BaseException) -> None:
        self._pending, self._unchecked = [], None


class _Verdict:
    """One checked step's agreed flags in a host buffer, ready once ``event`` (None: at once) has completed."""

    def __init__(self, view, event, step: int, epoch: int, batch: int) -> None:
        self.view, self.event, self.step, self.epoch, self.batch = view, event, step, epoch, batch

    def ranks(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()  # recorded a step ago: the device is past it, or nearly
        return [int(r) for r in numpy.flatnonzero(self.view)]
