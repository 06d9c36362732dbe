"""The recipe's device comes from ParallelEnv().device (one source) and its cuDNN/TF32 flags are applied and
recorded; torch.cuda is mocked (the real run is in tests/gpu/)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from fleetlite.distributed import ParallelEnv
from fleetlite.recipe.build import apply_speed_flags, resolve_device
from fleetlite.trainer.connector import Connector


@pytest.fixture
def restore_backend_flags():
    saved = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_recipe_and_trainer_take_the_ranks_device_from_parallel_env(clean_dist_env):
    # FLAGS_selected_gpus says GPU 1 while LOCAL_RANK % count would say GPU 0: ParallelEnv decides, for both
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
                 "MASTER_PORT": "1", "FLAGS_selected_gpus": "1"}.items():
        clean_dist_env.setenv(k, v)
    clean_dist_env.setattr(torch.cuda, "is_available", lambda: True)
    clean_dist_env.setattr(torch.cuda, "device_count", lambda: 2)
    clean_dist_env.setattr(torch.cuda, "current_device", lambda: 0)  # nobody called set_device: must not matter
    assert ParallelEnv().device == torch.device("cuda", 1)
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
    assert Connector(device="auto").device == torch.device("cuda", 1)


@pytest.mark.parametrize("device, given, expected", [
    ("cuda", {}, (True, True)), ("cpu", {}, (False, False)),
    ("cuda", {"cudnn_benchmark": False}, (False, True)), ("cpu", {"allow_tf32": True}, (False, True)),
])
def test_speed_flags_default_on_for_cuda_and_follow_the_config(restore_backend_flags, device, given, expected):
    cfg = OmegaConf.create({"cudnn_benchmark": None, "allow_tf32": None, **given})
    applied = apply_speed_flags(cfg, torch.device(device))
    assert (applied["cudnn_benchmark"], applied["allow_tf32"]) == expected
    assert torch.backends.cudnn.benchmark is expected[0]
    assert torch.backends.cuda.matmul.allow_tf32 is expected[1] and torch.backends.cudnn.allow_tf32 is expected[1]
