"""``TensorBoard``: epoch logs (and running batch values) as TensorBoard scalars on rank 0.

Public through :mod:`fleetlite.callbacks`. Needs the optional ``tensorboard`` package.
"""

from __future__ import annotations

from pathlib import Path

from .base import Callback, is_rank_zero, to_python
from .lr_monitor import learning_rates

__all__ = ["TensorBoard"]


def _summary_writer_class():
    try:  # tensorboard is an optional dependency: imported when a TensorBoard/VisualDL callback is made
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError("the TensorBoard callback needs the tensorboard package, which is not installed: "
                          "pip install tensorboard (or pip install 'fleetlite[tensorboard]'), or drop the "
                          f"TensorBoard callback ({e})") from None
    return SummaryWriter


class TensorBoard(Callback):
    """Write epoch logs (and every ``log_freq`` steps the running loss) as TensorBoard scalars on rank 0.

    The learning rate of each param group is written with the epoch logs (``epoch/lr``); with
    ``histogram_freq=N``, parameter and gradient histograms every N optimizer steps.

    Needs the ``tensorboard`` package; without it the constructor raises an
    ImportError that says how to install it.

    Example::

        trainer.fit(data, epochs=3, callbacks=[TensorBoard("runs/tb")])
    """

    def __init__(self, log_dir: str | None = None, update_freq: str | int = "epoch", histogram_freq: int = 0) -> None:
        super().__init__()
        self._writer_cls = _summary_writer_class()
        self.log_dir = log_dir
        self.update_freq = update_freq
        self.histogram_freq = int(histogram_freq)  # every N optimizer steps: parameter and gradient histograms
        self.writer = None
        self._hook = None

    def on_train_begin(self, logs=None):
        if is_rank_zero():
            log_dir = self.log_dir or str(Path(self.trainer.run_dir) / "tensorboard")
            self.writer = self._writer_cls(log_dir=log_dir)
            if self.histogram_freq > 0 and self._hook is None:  # grads exist only until the step clears them
                self._hook = self.trainer.optimizer.register_step_pre_hook(self._histograms)

    def _histograms(self, optimizer, args, kwargs):
        step = self.trainer.global_step + 1  # the step about to be taken
        if self.writer is None or step % self.histogram_freq:
            return
        for name, p in self.trainer.network.named_parameters():
            self.writer.add_histogram(f"params/{name}", p.detach().float().cpu(), step)
            if p.grad is not None:
                self.writer.add_histogram(f"grads/{name}", p.grad.detach().float().cpu(), step)

    def on_train_batch_end(self, step, logs=None):
        if self.writer is None or self.update_freq == "epoch" or not logs:
            return
        gs = self.trainer.global_step
        if self.trainer.at_step_boundary and gs % int(self.update_freq) == 0:
            for k, v in logs.items():
                if k != "batch_size":
                    self.writer.add_scalar(f"batch/{k}", to_python(v), gs)

    def on_epoch_end(self, epoch, logs=None):
        if self.writer is None:
            return
        logs = dict(logs or {})
        if not any(k == "lr" or k.startswith("lr/") for k in logs) and self.trainer.optimizer is not None:
            logs.update(learning_rates(self.trainer.optimizer))
        for k, v in logs.items():
            self.writer.add_scalar(f"epoch/{k}", to_python(v), epoch)
        self.writer.flush()

    def on_train_end(self, logs=None):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
