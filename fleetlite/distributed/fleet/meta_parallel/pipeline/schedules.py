"""The pipeline's schedule choice (Note [pipeline schedules] in parallel.py) and Paddle's micro-batches: a batch cut
into ``accumulate_steps`` pieces of ``micro_batch_size`` rows, or a list that is the micro-batches already.

Example::

    split_micro_batches((x1, [y0, y1]), 2, 4, "input")   # [(x1[:4], y0), (x1[4:], y1)]
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
)

__all__ = ["schedule_class", "split_micro_batches"]

_MODES = ("1F1B", "FThenB", "F-then-B", "VPP")


def schedule_class(mode: str, n: int, stages: int, virtual: int) -> type:
    """Note [pipeline schedules]."""
    if mode not in _MODES:
        raise ValueError(f"pipeline schedule_mode {mode!r} is not supported; use one of {list(_MODES)}")
    if virtual > 1:
        return ScheduleLoopedBFS if mode in ("FThenB", "F-then-B") else ScheduleInterleaved1F1B
    if mode == "VPP":
        raise ValueError("schedule_mode 'VPP' interleaves model chunks: build the PipelineLayer with "
                         "num_virtual_pipeline_stages > 1, or use '1F1B' / 'FThenB'")
    return Schedule1F1B if mode == "1F1B" and n >= stages else ScheduleGPipe


def split_micro_batches(value: Any, n: int, size: int, what: str) -> list[Any]:
    """``n`` micro-batches of ``size`` rows of a tensor or (nested) tuple or dict of tensors; a list is the
    micro-batches already (Paddle's list form: one entry per micro-batch); other values repeat."""
    if isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"the {what} micro-batches are a list of {len(value)} but accumulate_steps is {n}; "
                             "give one entry per micro-batch (or one batch of accumulate_steps * micro_batch_size "
                             "rows, not a list)")
        return list(value)
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 or value.shape[0] != n * size:
            raise ValueError(f"the {what} batch has {value.shape[0] if value.dim() else 0} rows but the pipeline "
                             f"expects accumulate_steps * micro_batch_size = {n} * {size} = {n * size}; change "
                             "the batch size or strategy.pipeline_configs")
        return list(value.split(size))
    if isinstance(value, tuple):
        parts = [split_micro_batches(v, n, size, what) for v in value]
        return [tuple(p[i] for p in parts) for i in range(n)]
    if isinstance(value, dict):  # Paddle's dict batches ({"x": img, "z": None}): each entry split alike
        split = {k: split_micro_batches(v, n, size, what) for k, v in value.items()}
        return [{k: p[i] for k, p in split.items()} for i in range(n)]
    return [value] * n
