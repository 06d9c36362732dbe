"""``paddle.hapi.progressbar``: Paddle's ``ProgressBar``, same signature and the same text, for code that drives
its own loop with it (Paddle's ``ProgBarLogger`` is built on it).

The Trainer's display (:class:`fleetlite.callbacks.ProgressBar`, a callback) is another class: it reads the
Trainer's logs, draws with rich on a terminal and knows ranks. This one is Paddle's plain text bar, byte for byte:
``step  3/10 [========>.....................] - loss: 0.5000 - acc: 0.7500 - ETA: 1s - 12ms/step``
(``verbose=1``, redrawn in place) or ``step  3/10 - loss: 0.5000 - 12ms/step`` (``verbose=2``, one line per call).

Example::

    from fleetlite.hapi.progressbar import ProgressBar

    bar = ProgressBar(num=len(loader), verbose=2)
    for step, (x, y) in enumerate(loader, 1):
        loss = train_step(x, y)
        bar.update(step, [("loss", float(loss))])
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

import numpy as np

__all__ = ["ProgressBar"]

_STDOUT = sys.stdout  # the default ``file``: then the text goes to ``sys.stdout`` as it is when written


def _bf16_to_float(values: Any) -> list[float]:
    """bfloat16 losses that arrive as uint16 bit patterns (Paddle's case) as floats."""
    bits = np.asarray(values, dtype=np.uint16).astype(np.uint32) << 16
    return [float(v) for v in bits.view(np.float32).ravel()]


def _fmt_values(values: Iterable[tuple[str, Any]], size1_arrays: bool) -> str:
    info = ""
    for k, val in values:
        info += f" - {k}:"
        for v in (val if isinstance(val, list) else [val]):
            if size1_arrays and isinstance(v, np.ndarray) and v.size == 1 and v.dtype in (np.float32, np.float64):
                v = v.reshape(-1)[0]
            if isinstance(v, (float, np.float32, np.float64)):
                info += f" {v:.4f}" if abs(v) > 1e-3 else f" {v:.4e}"
            else:
                info += f" {v}"
    return info


def _eta(seconds: float) -> str:
    if seconds > 3600:
        return f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}:{int(seconds % 60):02d}"
    if seconds > 60:
        return f"{int(seconds // 60)}:{int(seconds % 60):02d}"
    return f"{int(seconds)}s"


class ProgressBar:
    """Paddle's progress bar: ``update(current_num, values)`` writes ``step k/num`` with the values, the ETA
    and the time per step.

    Args:
        num: the total number of steps, or None (unknown: no bar, no ETA).
        width: the bar's width in characters (capped by the terminal's width, as Paddle).
        verbose: 1 redraws one line in place (a bar); 2 or 3 writes one line per update; 0 writes nothing.
        start: start the clock now (else call :meth:`start`).
        file: where to write; the default writes to ``sys.stdout`` as it is at each update.
        name: the unit's name in the text (``'step'``).

    ``values`` is a list of ``(name, value)`` pairs (a dict is taken too); a value may be a list (several
    numbers). Floats are written ``%.4f``, or ``%.4e`` when their magnitude is 1e-3 or less.

    Example::

        bar = ProgressBar(num=100, verbose=1)
        bar.update(10, [("loss", 0.25)])      # step  10/100 [==>...........................] - loss: 0.2500 ...
    """

    def __init__(self, num: int | None = None, width: int = 30, verbose: int = 1, start: bool = True,
                 file: TextIO = _STDOUT, name: str = "step") -> None:
        if isinstance(num, int) and num <= 0:
            raise TypeError("num should be None or integer (> 0)")
        self._num = num
        self._width = min(width, self._max_width())
        self._total_width = 0
        self._verbose = verbose
        self.file = file
        self.name = name
        self._start = time.time() if start else 0.0
        self._last_update = 0.0
        self._dynamic_display = ((hasattr(file, "isatty") and file.isatty()) or "ipykernel" in sys.modules
                                 or "posix" in sys.modules or "PYCHARM_HOSTED" in os.environ)

    @staticmethod
    def _max_width() -> int:
        columns = shutil.get_terminal_size().columns
        columns = columns if columns > 0 else 80
        return min(int(columns * 0.6), columns - 50)

    def _out(self) -> TextIO:
        return sys.stdout if self.file is _STDOUT else self.file

    def start(self) -> None:
        """(Re)start the clock the time per step and the ETA are measured from."""
        self._out().flush()
        self._start = time.time()

    def _speed(self, current_num: float, now: float) -> tuple[float, str]:
        per = (now - self._start) / current_num if current_num else 0.0
        if per >= 1 or per == 0:
            return per, f" - {per:.0f}s/{self.name}"
        if per >= 1e-3:
            return per, f" - {per * 1e3:.0f}ms/{self.name}"
        return per, f" - {per * 1e6:.0f}us/{self.name}"

    def _count(self, current_num: float) -> str:
        # %-formatting, as Paddle: a float step (``update(1e4, ...)``) is written as its integer part
        if self._num:
            digits = int(np.log10(self._num)) + 1
            return (f"{self.name} %{digits}d/%d") % (current_num, self._num)
        return f"{self.name} %3d" % current_num

    def update(self, current_num: float, values: Any = None) -> None:
        """Show step ``current_num`` (an int, or a float as Paddle takes it) with ``values``
        (``[(name, value), ...]``)."""
        now = time.time()
        values = list(values.items()) if isinstance(values, dict) else list(values or [])
        for i, (k, val) in enumerate(values):
            first = val[0] if isinstance(val, list) and val else val
            if k == "loss" and isinstance(first, np.uint16):
                values[i] = ("loss", _bf16_to_float(val))
        per, speed = self._speed(current_num, now)
        out = self._out()
        if self._verbose == 1:
            self._update_bar(out, current_num, values, per, speed)
            self._last_update = now
        elif self._verbose in (2, 3):
            out.write(self._count(current_num) + _fmt_values(values, True) + speed + "\n")
            out.flush()

    def _update_bar(self, out: TextIO, current_num: float, values: list, per: float, speed: str) -> None:
        prev = self._total_width
        out.write("\b" * prev + "\r" if self._dynamic_display else "\n")
        if self._num is not None:
            filled = int(self._width * float(current_num) / self._num)
            bar = self._count(current_num) + " ["
            if filled > 0:
                bar += "=" * (filled - 1) + (">" if current_num < self._num else "=")
            bar += "." * (self._width - filled) + "]"
        else:
            bar = self._count(current_num)
        self._total_width = len(bar)
        out.write(bar)
        info = _fmt_values(values, False)
        if self._num is not None and current_num < self._num:
            info += " - ETA: " + _eta(per * (self._num - current_num))
        info += speed
        self._total_width += len(info)
        if prev > self._total_width:
            info += " " * (prev - self._total_width)
        if self._num is None or current_num >= self._num:
            info += "\n"
        out.write(info)
        out.flush()
