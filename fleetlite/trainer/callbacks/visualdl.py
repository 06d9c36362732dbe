"""``VisualDL``: Paddle's VisualDL callback, written as TensorBoard event files on rank 0.

Public through :mod:`fleetlite.callbacks`. Needs the optional ``tensorboard`` package.
"""

from __future__ import annotations

import torch

from .base import Callback, is_rank_zero
from .tensorboard import _summary_writer_class

__all__ = ["VisualDL"]


class VisualDL(Callback):
    """Paddle's ``VisualDL(log_dir)``, written as TensorBoard event files (rank 0).

    Tags as Paddle's: ``train/<name>`` per training batch (step = batches so far), ``eval/<name>`` per
    evaluation (step = epoch). Needs the ``tensorboard`` package.

    Example::

        model.fit(train_set, val_set, batch_size=64, callbacks=VisualDL(log_dir="visualdl_log_dir"))
    """

    def __init__(self, log_dir: str) -> None:
        super().__init__()
        self._writer_cls = _summary_writer_class()
        self.log_dir = log_dir
        self.writer = None
        self.train_step = 0
        self.epoch = 0

    def _write(self, logs, mode: str, step: int) -> None:
        if not is_rank_zero():
            return
        if self.writer is None:
            self.writer = self._writer_cls(log_dir=self.log_dir)
        for k, v in (logs or {}).items():
            if k in ("batch_size", "step", "steps", "metrics"):
                continue
            if isinstance(v, (list, tuple)):
                v = v[0] if v else None
            if isinstance(v, torch.Tensor) and v.numel() == 1:
                v = v.item()
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(f"{mode}/{k}", v, step)

    def on_train_begin(self, logs=None):
        self.train_step = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, step, logs=None):
        self.train_step += 1
        self._write(logs, "train", self.train_step)

    def on_eval_end(self, logs=None):
        self._write(logs, "eval", self.epoch)
        if self.writer is not None:
            self.writer.flush()

    def on_train_end(self, logs=None):
        if self.writer is not None:
            self.writer.close()
            self.writer = None
