"""``ProgressBar``: rich progress on a terminal, plain periodic lines elsewhere (CI, log files). Rank 0 only.

Public through :mod:`fleetlite.callbacks` and :mod:`fleetlite.trainer.callbacks`; ``rich`` is imported only when a
terminal display is actually started.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

import torch

from .base import Callback, is_rank_zero, to_python

__all__ = ["ProgressBar", "ProgBarLogger", "format_logs", "epoch_label", "display_epoch_label"]


def epoch_label(epoch: int, epochs: int | None) -> str:
    """``"Epoch 3/9"``: the 0-based label of the logs (epoch numbers in the History, metrics.csv, checkpoint
    names and the recipe's run log are 0-based, so the last of 10 is 9). The progress display prints
    :func:`display_epoch_label` instead."""
    return f"Epoch {epoch}/{epochs - 1 if isinstance(epochs, int) else '?'}"


def display_epoch_label(epoch: int, epochs: int | None) -> str:
    """``"Epoch 4/10"`` for epoch 3 of 10: what the progress lines print, 1-based as Keras and Paddle print it;
    only the printed label, the epoch numbers everywhere else stay 0-based."""
    return f"Epoch {epoch + 1}/{epochs if isinstance(epochs, int) else '?'}"


def format_logs(logs: dict[str, Any] | None, skip: tuple[str, ...] = ("batch_size",)) -> str:
    """``"loss: 0.1234 - acc: 0.5000"`` from a logs dict (tensors and lists welcome)."""
    parts = []
    for k, v in (logs or {}).items():
        if k in skip:
            continue
        v = to_python(v)
        if isinstance(v, float):
            parts.append(f"{k}: {v:.4f}")
        elif isinstance(v, (list, tuple)):
            parts.append(f"{k}: " + "/".join(f"{to_python(x):.4f}" for x in v))
        else:
            parts.append(f"{k}: {v}")
    return " - ".join(parts)


_BAR_SECONDS = 0.1  # the terminal bar's count is updated about this often


class _Line:
    """A progress line whose scalar tensor values travel to the host in one non-blocking copy (pinned memory and
    an event on CUDA; at once on the CPU, or when the values are not all 0-d tensors of one device)."""

    def __init__(self, logs: dict[str, Any] | None, head: str, rate: float, left: float, done: int) -> None:
        self.head, self.rate, self.left, self.done = head, rate, left, done
        self.logs = dict(logs or {})
        self.keys = [k for k, v in self.logs.items() if isinstance(v, torch.Tensor) and v.numel() == 1]
        self.event = None
        self.host: torch.Tensor | None = None
        tensors = [self.logs[k].detach() for k in self.keys]
        if not tensors or len({t.device for t in tensors}) > 1:
            self.keys = []
            return
        self.floating = [t.is_floating_point() for t in tensors]
        stacked = torch.stack([t.reshape(()).to(torch.float64) for t in tensors])
        if stacked.device.type == "cuda":
            self.host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
            self.host.copy_(stacked, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = stacked.cpu()

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def values(self) -> dict[str, Any]:
        """The logs with host numbers in place of the copied tensors (waits for the copy if it is not done)."""
        if self.event is not None:
            self.event.synchronize()
        if self.host is not None:
            for k, v, f in zip(self.keys, self.host.tolist(), self.floating):
                self.logs[k] = v if f else int(v)
        return self.logs


def _hms(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressBar(Callback):
    """Show epoch, step/total, loss and metrics, samples/s and ETA, on rank 0 only.

    On a terminal (``stream.isatty()``) a rich progress bar is drawn; otherwise
    a plain line is written every ``log_freq`` steps and at each epoch end,
    e.g. ``Epoch 1/5 step 40/196 - loss: 1.2345 - acc: 0.5000 - 2311.4 samples/s - ETA 0:00:09`` (the first of
    five epochs: the printed label is 1-based as in Keras and Paddle, see :func:`display_epoch_label`; the
    epoch numbers in the logs and checkpoints stay 0-based).
    ``fit`` adds one (``log_freq`` from ``fit``) unless one is given or ``verbose=0``.

    Example::

        trainer.fit(data, epochs=2, callbacks=[ProgressBar(log_freq=20)])
        ProgressBar(stream=open("train.log", "a"))    # plain lines into a file
    """

    def __init__(self, log_freq: int | None = None, verbose: int = 1, stream: TextIO | None = None,
                 use_rich: bool | None = None) -> None:
        super().__init__()
        self.log_freq = log_freq
        self.verbose = verbose
        self.stream = stream
        self.use_rich = use_rich
        self._progress = None
        self._task = None
        self._active = False
        self._waiting: _Line | None = None  # a progress line whose values are being copied to the host
        self._next_bar = 0.0  # when the terminal bar's count is next updated (time.perf_counter)

    # -- helpers ---------------------------------------------------------------
    def epoch_label(self, epoch: int, epochs: int | None) -> str:
        """The epoch's label in the progress lines (:func:`display_epoch_label`: ``"Epoch 1/10"`` first)."""
        return display_epoch_label(epoch, epochs)

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stdout

    def _line(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            out = self._out()
            out.write(text + "\n")
            out.flush()

    def _freq(self) -> int:
        return max(int(self.log_freq or self.params.get("log_freq") or 10), 1)

    def _rich_wanted(self) -> bool:
        if self.use_rich is not None:
            return self.use_rich
        isatty = getattr(self._out(), "isatty", None)
        return bool(isatty and isatty())

    def _throughput(self) -> tuple[float, float]:
        elapsed = self._elapsed()
        done = self._done - self._start_step
        rate = self._samples / elapsed
        left = (self._total - self._done) * elapsed / done if done > 0 and self._total else 0.0
        return rate, left

    # -- hooks -------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._active = self.verbose > 0 and is_rank_zero()

    def on_epoch_begin(self, epoch, logs=None):
        if not self._active:
            return
        self._epoch = epoch
        self._total = int(self.params.get("steps") or 0)
        self._start_step = self._done = int(getattr(self.trainer, "batch_in_epoch", 0) or 0)
        self._samples = 0.0
        self._world = int(self.params.get("world_size", 1))
        self._t0 = time.perf_counter()
        self._waiting, self._next_bar = None, 0.0
        self._desc = self.epoch_label(epoch, self.params.get("epochs"))
        if self._rich_wanted():
            self._start_rich()

    def _start_rich(self) -> None:
        # rich is optional and slow to import: only when a terminal display is actually started
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
        from rich.table import Column

        console = Console(file=self._out(), force_terminal=True if self.use_rich else None)
        # fixed-width columns first: on a narrow terminal only the metrics text is shortened
        info = TextColumn("{task.fields[info]}", table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"))
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                                  TimeRemainingColumn(), info, console=console, transient=False, expand=True)
        self._progress.start()
        self._task = self._progress.add_task(self._desc, total=self._total or None, completed=self._done,
                                             info="")

    def on_train_batch_end(self, step, logs=None):
        # Note [progress off the hot path]: a batch that prints no line costs a counter (and, on a terminal, a
        # clock read: the bar's count is updated at most every 0.1 s); a line's values are copied to the host
        # without blocking and the line is written once they are there (at once on the CPU), its rate and ETA
        # taken when it was due
        if not self._active:
            return
        self._done = step + 1
        n = (logs or {}).get("batch_size", 0)
        self._samples += (n if isinstance(n, int) else float(to_python(n))) * self._world
        if self._waiting is not None and self._waiting.ready():
            self._show()
        if self._done % self._freq() and self._done != self._total:
            if self._progress is not None:
                now = time.perf_counter()
                if now >= self._next_bar:
                    self._progress.update(self._task, completed=self._done)
                    self._next_bar = now + _BAR_SECONDS
            return
        self._show()  # the previous line, if its values are still on their way
        rate, left = self._throughput()
        total = f"/{self._total}" if self._total else ""
        self._waiting = _Line(logs, f"{self._desc} step {self._done}{total}", rate, left, self._done)
        if self._waiting.ready():
            self._show()

    def _elapsed(self) -> float:
        return max(time.perf_counter() - self._t0, 1e-9)

    def _show(self) -> None:
        """Write the waiting line (waiting for its values if they are still being copied)."""
        line, self._waiting = self._waiting, None
        if line is None:
            return
        info = format_logs(line.values())
        if self._progress is not None:
            self._progress.update(self._task, completed=line.done, info=f"{line.rate:.1f} samples/s - {info}")
        else:
            self._line(f"{line.head} - {info} - {line.rate:.1f} samples/s - ETA {_hms(line.left)}")

    def on_epoch_end(self, epoch, logs=None):
        if not self._active:
            return
        self._show()
        elapsed = time.perf_counter() - self._t0
        rate = self._samples / max(elapsed, 1e-9)
        self._stop_rich()
        self._line(f"{self._desc} done - {format_logs(logs)} - {rate:.1f} samples/s - {elapsed:.1f} s")

    def _stop_rich(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None

    def on_train_end(self, logs=None):
        if self._active:
            self._show()
        self._stop_rich()

    def on_eval_end(self, logs=None):
        if self.verbose > 0 and is_rank_zero() and not getattr(self.trainer, "fitting", False):
            self._line(f"Eval - {format_logs(logs)}")

    def on_predict_end(self, logs=None):
        if self.verbose > 1 and is_rank_zero():
            self._line(f"Predict - {format_logs(logs)}")


class ProgBarLogger(ProgressBar):
    """Paddle's ``ProgBarLogger(log_freq=1, verbose=2)``: the progress display under Paddle's name and defaults,
    with Paddle's epoch label (``"Epoch 1/10"`` for the first of ten, as every progress display), whichever face
    runs it.

    Example::

        model.fit(train_set, batch_size=64, callbacks=ProgBarLogger(log_freq=10))
    """

    def __init__(self, log_freq: int = 1, verbose: int = 2) -> None:
        super().__init__(log_freq=log_freq, verbose=verbose)
