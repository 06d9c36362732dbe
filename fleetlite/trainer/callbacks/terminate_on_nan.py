"""``TerminateOnNaN``: stop every rank at the same optimizer step when the training loss stops being finite.

Public through :mod:`fleetlite.callbacks`.

# Note [non-finite loss]
Keras' ``TerminateOnNaN`` looks at one process's loss. With several ranks a
NaN may appear on one rank only (one bad sample); its gradients then poison
every rank through the all-reduce, but the other ranks' own losses can stay
finite for that step. So each rank checks its running epoch loss (a NaN
stays in the running mean, nothing is missed between checks) at a step
boundary, and the ranks add their verdicts with one all-reduce of a
``world_size``-long vector: every rank learns at the same step which ranks
saw it, and all raise the same :class:`NonFiniteLossError`. Nothing is saved
after the bad step (the save requests of that step never run: the raise ends
``fit`` before the Trainer runs them), and
:meth:`fleetlite.trainer.checkpoint_connector.CheckpointConnector.save` refuses to point ``latest.pt`` at
weights that are not finite in any case. Cost: one device sync and one tiny
all-reduce every ``check_freq`` optimizer steps.
"""

from __future__ import annotations

import torch

from ...distributed.agreement import flagged_ranks
from .base import Callback, is_rank_zero

__all__ = ["TerminateOnNaN", "NonFiniteLossError"]


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; raised on every rank at the same step by ``TerminateOnNaN``."""

    def __init__(self, message: str, step: int, ranks: list[int]):
        super().__init__(message)
        self.step = step
        self.ranks = ranks


class TerminateOnNaN(Callback):
    """Keras' ``TerminateOnNaN``: stop every rank at the first step whose training loss is not finite.

    The finiteness flag is agreed across ranks (one tiny all-reduce per
    checked step, see Note [non-finite loss]), so every rank stops after the
    same step; ``trainer.terminated_on_nan`` holds that global step. The
    checkpoints written before the bad step, ``latest.pt`` included, are kept
    (no final checkpoint of the broken weights). As in Keras, ``fit`` then
    returns; ``raise_error=True`` (the recipes' default, through
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

    def on_train_batch_end(self, step, logs=None):
        t = self.trainer
        if not t.at_step_boundary or t.global_step % self.check_freq or not logs or "loss" not in logs:
            return
        loss = logs["loss"]
        value = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        bad = ~torch.isfinite(value.to(torch.float64)).all()
        ranks = flagged_ranks(bad, t.device)
        if not ranks:
            return
        t.terminated_on_nan = t.global_step
        t.stop_training = True
        where = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
        message = (f"non-finite loss (NaN or inf) at optimizer step {t.global_step} (epoch {t.epoch}, batch {step}) "
                   f"on {where}: training stopped on every rank; checkpoints written before it are kept and "
                   "latest.pt is never replaced by non-finite weights. Try a lower learning rate (e.g. optim.lr), "
                   "gradient clipping, or float32 instead of amp")
        if self.raise_error:
            raise NonFiniteLossError(message, t.global_step, ranks)
        if is_rank_zero():
            print(f"Batch {step}: invalid loss, terminating training ({message})")
