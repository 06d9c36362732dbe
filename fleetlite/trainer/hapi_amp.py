"""Paddle's ``Model.prepare(amp_configs=...)`` read into a fleet strategy (``fleetlite.Model``'s mixed precision).

Example::

    level, strategy = amp_strategy("O1", torch.device("cuda"))   # "O1", {"amp": True, "amp_configs": {...}}
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["amp_strategy"]

_AMP_KEYS = {"init_loss_scaling", "incr_ratio", "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf",
             "use_dynamic_loss_scaling", "custom_white_list", "custom_black_list", "custom_black_varnames",
             "use_pure_fp16", "use_fp16_guard", "dtype"}


def amp_strategy(amp_configs: Any, device: torch.device) -> tuple[str, dict[str, Any] | None]:
    """``(level, strategy)`` of Paddle's ``prepare(amp_configs=...)``: the level (``'O0'`` when switched off)
    and the fleet strategy dict that turns amp on (None: float32). Raises as Paddle on unknown levels or keys."""
    if not amp_configs:
        return "O0", None
    if isinstance(amp_configs, str):
        if amp_configs not in ("O0", "O1", "O2"):
            raise ValueError("The level of amp_configs should be 'O0', 'O1' or 'O2'.")
        level, cfg = amp_configs, {}
    elif isinstance(amp_configs, dict):
        level = amp_configs.get("level", "O1")
        if level not in ("O0", "O1", "O2"):
            raise ValueError("amp_configs['level'] should be 'O0', 'O1' or 'O2'.")
        cfg = {k: v for k, v in amp_configs.items() if k != "level"}
        unknown = set(cfg) - _AMP_KEYS
        if unknown:
            raise ValueError("Except for 'level', the keys of 'amp_configs' must be accepted by mixed "
                             f"precision APIs, but {tuple(sorted(unknown))} could not be recognized.")
    else:
        raise TypeError(f"amp_configs must be a level string ('O1') or a dict, got {type(amp_configs).__name__}")
    if level == "O0":
        return "O0", None
    if device.type != "cuda":
        warnings.warn(f"fleetlite: amp_configs level {level} needs a CUDA device; running in float32 on "
                      f"{device} (as Paddle without a GPU)", UserWarning, stacklevel=4)
        return "O0", None
    keep = ("init_loss_scaling", "incr_ratio", "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf",
            "use_dynamic_loss_scaling", "dtype")
    configs = {k: cfg[k] for k in keep if k in cfg}
    configs["use_pure_fp16"] = level == "O2" or bool(cfg.get("use_pure_fp16", False))
    return level, {"amp": True, "amp_configs": configs}
