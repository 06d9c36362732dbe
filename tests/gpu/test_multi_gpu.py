"""Group B: two or more GPUs, NCCL (cpu:gloo,cuda:nccl). Parity with DDP, an unused parameter, a killed rank,
and `--gpus 1` landing on physical GPU 1."""

from __future__ import annotations

import os

import pytest
import torch
from gpu_helpers import dp_vs_ddp, needs_gpus

from fleetlite.testing import run_launch, run_ranks

pytestmark = [pytest.mark.gpu, needs_gpus(2)]


def nccl_parity(rank, world):
    import fleetlite.distributed as dist

    dist.init_parallel_env(backend="nccl")
    return dp_vs_ddp(rank, world)


@pytest.mark.timeout(300)
def test_parity_with_ddp_over_nccl():
    for out in run_ranks(nccl_parity, world_size=2, timeout=280, init=False):
        for k, v in out["ddp"].items():
            assert torch.allclose(out["fleetlite"][k], v, atol=1e-5), k


def killed_rank(rank, world):
    import fleetlite.distributed as dist
    from fleetlite.testing import timeout_scale

    # NCCL's own timeout far beyond run_ranks' (both load-scaled): an error before run_ranks gives up can only
    # come from the peer monitor (an order of events, not a measured duration)
    dist.init_parallel_env(backend="nccl", timeout=int(3000 * timeout_scale()))
    t = torch.ones(1, device=dist.ParallelEnv().device)
    dist.all_reduce(t)
    if rank == 1:
        os.kill(os.getpid(), 9)
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
    except dist.CollectiveError as e:
        return str(e)
    return None


@pytest.mark.timeout(300)
def test_a_killed_rank_is_detected_before_the_collective_timeout():
    out = run_ranks(killed_rank, world_size=2, timeout=280, init=False, expect_failure=True)
    status, message = out[0]
    assert status == "ok" and message is not None, out
    assert "rank 1 died" in message


@pytest.mark.timeout(300)
def test_gpus_option_lands_on_the_named_physical_gpu(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("import torch\nprint('uuid', torch.cuda.get_device_properties(0).uuid)\n")
    res = run_launch(["--gpus", "1", str(script)], timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"uuid {torch.cuda.get_device_properties(1).uuid}" in res.stdout
