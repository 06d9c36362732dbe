"""Paddle's ``Model.prepare(amp_configs=...)`` read into a fleet strategy (``fleetlite.Model``'s mixed precision).

Example::

    level, strategy = amp_strategy("O1", torch.device("cuda"))   # "O1", {"amp": True, "amp_configs": {...}}
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["amp_strategy"]

_CUSTOM_LISTS = {"custom_white_list", "custom_black_list", "custom_black_varnames"}
# Paddle's accepted scaler keys (``_check_amp_configs``); ``dtype`` ('float16'/'bfloat16') is fleetlite's extra
_ACCEPTED = {"init_loss_scaling", "incr_ratio", "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf",
             "use_dynamic_loss_scaling", "use_fp16_guard", "dtype"}


def _check_dict(amp_configs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Paddle's ``Model._prepare_amp`` checks on a dict, in Paddle's order: the level, then (only when other keys
    are given and the level is not O0) ``use_pure_fp16`` refused, unknown keys refused, and ``use_fp16_guard``
    refused in dynamic (eager) mode -- every refusal a ValueError with Paddle's message."""
    level = amp_configs.get("level", "O1")
    if level not in ("O0", "O1", "O2"):
        raise ValueError("amp_configs['level'] should be 'O0', 'O1' or 'O2'.")
    keys = set(amp_configs) - {"level"}
    if not keys or level == "O0":
        return level, {}
    if "use_pure_fp16" in keys:
        raise ValueError("'use_pure_fp16' is an invalid parameter, the level of mixed precision training only "
                         "depends on 'O1' or 'O2'.")
    unknown = keys - _CUSTOM_LISTS - _ACCEPTED
    if unknown:
        raise ValueError("Except for 'level', the keys of 'amp_configs' must be accepted by mixed precision APIs, "
                         f"but {tuple(sorted(unknown))} could not be recognized.")
    if "use_fp16_guard" in keys:  # fleetlite runs eagerly, as Paddle's dynamic mode
        raise ValueError("'use_fp16_guard' is supported in static graph mode only.")
    return level, {k: amp_configs[k] for k in keys}


def amp_strategy(amp_configs: Any, device: torch.device) -> tuple[str, dict[str, Any] | None]:
    """``(level, strategy)`` of Paddle's ``prepare(amp_configs=...)``: the level (``'O0'`` when switched off)
    and the fleet strategy dict that turns amp on (None: float32). Raises as Paddle on unknown levels or keys,
    on ``use_pure_fp16`` and on ``use_fp16_guard`` (static graph only in Paddle; fleetlite is eager)."""
    if not amp_configs:
        return "O0", None
    if isinstance(amp_configs, str):
        if amp_configs not in ("O0", "O1", "O2"):
            raise ValueError("The level of amp_configs should be 'O0', 'O1' or 'O2'.")
        level, cfg = amp_configs, {}
    elif isinstance(amp_configs, dict):
        level, cfg = _check_dict(amp_configs)
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
    configs["use_pure_fp16"] = level == "O2"
    return level, {"amp": True, "amp_configs": configs}
