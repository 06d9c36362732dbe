"""The ``Profiler`` callback: ``torch.profiler`` over training steps, one Chrome/Perfetto trace per rank.

Example::

    from fleetlite.callbacks import Profiler
    trainer.fit(data, epochs=1, save_dir="runs/a", callbacks=[Profiler(wait=1, warmup=1, active=3)])
    # runs/a/profiler/rank0.step5.json (open in chrome://tracing or ui.perfetto.dev); top ops printed on rank 0
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ...distributed import collective
from .base import Callback, is_rank_zero

__all__ = ["Profiler"]


class Profiler(Callback):
    """Profile training batches on every rank with ``torch.profiler`` and a wait/warmup/active schedule.

    Each rank writes ``<dir>/rank<r>.step<n>.json`` (Chrome trace format: chrome://tracing,
    ui.perfetto.dev) when an active window ends, or when training ends inside one; rank 0 prints the top
    ``row_limit`` ops by self time (also kept in ``self.table``). ``dir`` defaults to
    ``<run dir>/profiler``. The traces hold the engine's gradient all-reduces (``gloo:all_reduce`` /
    ``nccl:all_reduce``) next to the forward and backward ops, so overlap is visible.

    Example::

        trainer.fit(data, epochs=1, callbacks=[Profiler(wait=2, warmup=1, active=2, dir="prof")])
    """

    def __init__(self, wait: int = 1, warmup: int = 1, active: int = 3, repeat: int = 1, dir: str | None = None,
                 record_shapes: bool = False, profile_memory: bool = False, with_stack: bool = False,
                 row_limit: int = 15, print_table: bool = True) -> None:
        super().__init__()
        for name, v in (("wait", wait), ("warmup", warmup), ("repeat", repeat)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"Profiler({name}={v!r}) must be an integer >= 0")
        if isinstance(active, bool) or not isinstance(active, int) or active < 1:
            raise ValueError(f"Profiler(active={active!r}) must be an integer >= 1 (the steps recorded)")
        self.schedule = dict(wait=wait, warmup=warmup, active=active, repeat=repeat)
        self.dir = dir
        self.options = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
        self.row_limit = row_limit
        self.print_table = print_table
        self.traces: list[Path] = []
        self.table: str | None = None
        self._prof = None
        self._steps = 0

    def _ready(self, prof) -> None:
        out = Path(self.dir or Path(self.trainer.run_dir) / "profiler")
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"rank{collective.get_rank()}.step{self._steps}.json"
        tmp = path.with_suffix(".json.tmp")
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
        self.traces.append(path)
        if is_rank_zero():
            sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
            self.table = prof.key_averages().table(sort_by=sort, row_limit=self.row_limit)
            if self.print_table:
                print(f"profiler: top ops by self time (rank 0, steps up to {self._steps}); trace {path}\n"
                      f"{self.table}", flush=True)

    def on_train_begin(self, logs=None):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.trainer.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.traces, self._steps = [], 0
        self._prof = torch.profiler.profile(activities=activities, schedule=torch.profiler.schedule(**self.schedule),
                                            on_trace_ready=self._ready, **self.options)
        self._prof.start()

    def on_train_batch_end(self, step, logs=None):
        if self._prof is not None:
            self._steps += 1
            self._prof.step()

    def on_train_end(self, logs=None):
        self.close()

    def on_exception(self, error: BaseException) -> None:
        self.close()

    def close(self) -> None:
        """Stop profiling (a window still recording is written out)."""
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.stop()

    def state_dict(self) -> dict[str, Any]:
        return {}
