"""Paddle's ``ModelCheckpoint(save_freq=1, save_dir=None)``: ``Model.save`` prefixes ``{save_dir}/{epoch}`` and
``{save_dir}/final``. Public as ``fleetlite.callbacks.ModelCheckpoint`` (``paddle.callbacks.ModelCheckpoint``)."""

from __future__ import annotations

import os

from ...hapi_io import PaddleFiles
from ..base import Callback, is_rank_zero

__all__ = ["ModelCheckpoint"]


class ModelCheckpoint(Callback):
    """Paddle's ``ModelCheckpoint``: after each epoch with ``epoch % save_freq == 0`` write ``{save_dir}/{epoch}``,
    and at the end of training ``{save_dir}/final``, as Paddle's ``Model.save`` files (``.pdparams`` weights and
    ``.pdopt`` optimizer state). No ``save_dir``: nothing is saved.

    The same files whichever face runs it (``fleetlite.Model`` or ``fleetlite.Trainer``). Saving is collective
    (every rank joins, rank 0 writes: Note [collective hapi save]), so it works under sharding. For the
    Trainer's full-state, resumable checkpoints use :class:`fleetlite.trainer.callbacks.ModelCheckpoint`.

    Example::

        model.fit(train_set, batch_size=64, epochs=4, callbacks=ModelCheckpoint(save_freq=2, save_dir="ckpt"))
        # ckpt/0.pdparams, ckpt/2.pdparams, ckpt/final.pdparams (+ .pdopt)
    """

    def __init__(self, save_freq: int = 1, save_dir: str | None = None) -> None:
        super().__init__()
        if isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1:
            raise TypeError(f"ModelCheckpoint(save_freq={save_freq!r}): this is Paddle's ModelCheckpoint(save_freq=1, "
                            "save_dir=None) and save_freq must be a positive integer; for the Trainer's full-state "
                            "checkpoints use fleetlite.trainer.callbacks.ModelCheckpoint(save_dir, ...)")
        self.save_freq = save_freq
        self.save_dir = save_dir
        self.epoch = 0

    def _save(self, name: str) -> None:
        if not self.save_dir or self.trainer is None:
            return
        path = f"{self.save_dir}/{name}"
        if is_rank_zero():
            print(f"save checkpoint at {os.path.abspath(path)}")
        PaddleFiles(self.trainer).save(path)  # collective: every rank (Note [collective hapi save])

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch % self.save_freq == 0:
            self._save(str(epoch))

    def on_train_end(self, logs=None):
        self._save("final")
