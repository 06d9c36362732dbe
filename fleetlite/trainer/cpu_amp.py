"""AMP on a CPU device: allowed, but warned about once, with the measurement that motivates the warning.

Example::

    from fleetlite.trainer.cpu_amp import warn_cpu_amp
    warn_cpu_amp(strategy, torch.device("cpu"))   # warns once when strategy.amp is on
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["warn_cpu_amp", "CPU_AMP_NOTE"]

#: Why AMP on a CPU is warned about: issue 13's measurement (quick-start CNN, batch 32, 2-core CPU, torch 2.14).
CPU_AMP_NOTE = ("bfloat16 autocast on a CPU without fast bf16 kernels is usually slower than float32: the "
                "quick-start CNN measured 617 ms a step against 82 ms in float32 (7.5x) on a 2-core CPU")


def warn_cpu_amp(strategy: Any, device: torch.device) -> None:
    """Warn once per process when the strategy turns AMP on for a CPU device (see ``CPU_AMP_NOTE``)."""
    if strategy is not None and getattr(strategy, "amp", False) and device.type == "cpu":
        from ..utils.user_warning import warn_once

        warn_once("cpu-amp", f"fleetlite: strategy.amp is on with a CPU device; {CPU_AMP_NOTE}. Use amp on GPUs, "
                             "or set strategy.amp=False (recipes: drop strategy=amp_bf16) unless you measured a gain")
