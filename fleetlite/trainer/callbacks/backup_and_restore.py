"""``BackupAndRestore``: Keras' automatic backup and resume after an interruption.

Public through :mod:`fleetlite.callbacks`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .base import is_rank_zero
from .model_checkpoint import ModelCheckpoint

__all__ = ["BackupAndRestore"]


class BackupAndRestore(ModelCheckpoint):
    """Keras' ``BackupAndRestore(backup_dir, save_freq='epoch', delete_checkpoint=True)``: checkpoint every
    epoch (or every ``save_freq`` steps) and resume from it automatically when ``fit`` runs again after an
    interruption (``fit(resume="auto")`` on ``backup_dir``); a run that ends normally deletes the backup.

    Example::

        trainer.fit(data, epochs=10, callbacks=[BackupAndRestore("/tmp/backup")])   # rerun after a crash
    """

    _auto_resume = True

    def __init__(self, backup_dir: str, save_freq: str | int = "epoch", delete_checkpoint: bool = True) -> None:
        if save_freq == "epoch":
            super().__init__(backup_dir, save_freq=1)
        elif isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0:
            super().__init__(backup_dir, save_freq=None, save_steps=save_freq)
        else:
            raise ValueError(f"BackupAndRestore(save_freq={save_freq!r}): 'epoch' or a positive number of steps")
        self.delete_checkpoint = delete_checkpoint

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        t = self.trainer
        finished = not getattr(t, "preempted", None) and getattr(t, "terminated_on_nan", None) is None
        if self.delete_checkpoint and finished and is_rank_zero() and self.directory is not None:
            shutil.rmtree(Path(self.directory), ignore_errors=True)
