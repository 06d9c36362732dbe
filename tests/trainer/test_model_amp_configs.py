"""``Model.prepare(amp_configs=...)`` refuses what Paddle's ``Model._prepare_amp`` refuses, with its exception type
and message: ``use_fp16_guard`` is static-graph only, so a dynamic-mode
(eager) ``prepare`` raises ``ValueError``; ``use_pure_fp16`` is refused; with level O0, or no key but the level,
nothing else is checked."""

import pytest
import torch

import fleetlite


def _model():
    return fleetlite.Model(torch.nn.Linear(4, 2))


def test_use_fp16_guard_is_refused_as_paddle_refuses_it():
    with pytest.raises(ValueError, match=r"^'use_fp16_guard' is supported in static graph mode only\.$"):
        _model().prepare(amp_configs={"level": "O1", "use_fp16_guard": True})
    with pytest.raises(ValueError, match="static graph mode only"):
        _model().prepare(amp_configs={"level": "O2", "use_fp16_guard": False, "init_loss_scaling": 1024})


def test_paddle_check_order_and_the_keys_it_skips():
    with pytest.raises(ValueError, match="'use_pure_fp16' is an invalid parameter"):
        _model().prepare(amp_configs={"level": "O1", "use_pure_fp16": True})
    with pytest.raises(ValueError, match=r"could not be recognized"):  # unknown keys before use_fp16_guard
        _model().prepare(amp_configs={"use_fp16_guard": True, "bad": 1})
    _model().prepare(amp_configs={"level": "O0", "use_fp16_guard": True})  # O0: Paddle checks no further
    with pytest.warns(UserWarning, match="CUDA"):  # accepted keys (custom lists too), float32 on the CPU
        _model().prepare(amp_configs={"level": "O1", "custom_white_list": ["matmul"], "incr_ratio": 2.0})
