"""fleetlite.distributed env and process group: both launcher conventions, every bad input, real 2-rank groups."""

from __future__ import annotations

import datetime
import os
import time
import warnings

import pytest
import torch
import torch.distributed as tdist

import fleetlite.distributed as dist
from fleetlite.distributed import ParallelEnv, collective
from fleetlite.distributed.env import DistEnvError, read_env
from fleetlite.testing import free_port, run_ranks

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400"}
PADDLE = {"PADDLE_TRAINER_ID": "3", "PADDLE_TRAINERS_NUM": "4",
          "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171",
          "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6171", "FLAGS_selected_gpus": "1"}
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")


# ---- parsing: torchrun's convention ----------------------------------------------------------------------------

def test_torchrun_variables_are_read():
    env = read_env(TORCHRUN)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (1, 2, 1, 2)
    assert (env.master_addr, env.master_port, env.source) == ("10.0.0.5", 29400, "torchrun")
    # one node: the Paddle endpoint list is derived the way `fleetlite launch` exports it
    assert env.trainer_endpoints == ("10.0.0.5:29401", "10.0.0.5:29402")
    assert env.current_endpoint == "10.0.0.5:29402"


def test_torchrun_without_local_variables_assumes_one_node():
    env = read_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "100"})
    assert (env.local_rank, env.local_world_size) == (1, 2)


def test_torchrun_on_several_nodes_does_not_invent_endpoints():
    env = read_env({**TORCHRUN, "RANK": "3", "WORLD_SIZE": "4"})
    assert (env.rank, env.local_rank, env.local_world_size) == (3, 1, 2)
    assert env.trainer_endpoints == () and env.current_endpoint == ""


def test_torchrun_wins_and_stale_paddle_endpoints_are_ignored():
    env = read_env({**TORCHRUN, **PADDLE})  # four stale Paddle endpoints for a world of two
    assert (env.rank, env.world_size, env.source) == (1, 2, "torchrun")
    assert env.trainer_endpoints == ("10.0.0.5:29401", "10.0.0.5:29402")
    assert env.selected_gpus == (1,)


def test_torchrun_uses_the_launchers_paddle_endpoints_when_consistent():
    eps = {"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINER_ENDPOINTS": "a:1,b:2", "PADDLE_CURRENT_ENDPOINT": "b:2"}
    env = read_env({**TORCHRUN, **eps})
    assert env.trainer_endpoints == ("a:1", "b:2") and env.current_endpoint == "b:2"


def test_no_variables_means_single_process():
    env = read_env({})
    assert (env.rank, env.world_size, env.local_rank, env.source) == (0, 1, 0, "none")


# ---- parsing: Paddle's convention --------------------------------------------------------------------------------

def test_paddle_variables_are_read():
    env = read_env(PADDLE)
    assert (env.rank, env.world_size, env.source) == (3, 4, "paddle")
    assert env.trainer_endpoints == tuple(PADDLE["PADDLE_TRAINER_ENDPOINTS"].split(","))
    assert env.current_endpoint == "10.0.0.2:6171"
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 6170)  # rank 0's endpoint hosts the store
    assert (env.local_rank, env.local_world_size) == (1, 2)  # second trainer on host 10.0.0.2
    assert env.selected_gpus == (1,)


def test_paddle_current_endpoint_defaults_to_the_listed_one():
    env = read_env({k: v for k, v in PADDLE.items() if k != "PADDLE_CURRENT_ENDPOINT"})
    assert env.current_endpoint == "10.0.0.2:6171"


# ---- parsing: every bad input is one clear error naming the variable -------------------------------------------

BAD = [
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, ["RANK=2", "WORLD_SIZE=2"]),
    ({"RANK": "-1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, ["RANK=-1", "0..1"]),
    ({"RANK": "0", "WORLD_SIZE": "0"}, ["WORLD_SIZE=0", "number of processes"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, ["MASTER_ADDR", "fleetlite launch"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, ["MASTER_PORT", "fleetlite launch"]),
    ({"RANK": "one", "WORLD_SIZE": "2"}, ["RANK='one'", "not an integer"]),
    ({"RANK": "0", "WORLD_SIZE": "2.0"}, ["WORLD_SIZE='2.0'", "not an integer"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "http"}, ["MASTER_PORT='http'"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, ["MASTER_PORT=70000", "1..65535"]),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, ["LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"]),
    ({**TORCHRUN, "LOCAL_RANK": "x"}, ["LOCAL_RANK='x'", "not an integer"]),
    ({**TORCHRUN, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, ["LOCAL_WORLD_SIZE=4", "WORLD_SIZE=2"]),
    ({**TORCHRUN, "FLAGS_selected_gpus": "gpu0"}, ["FLAGS_selected_gpus='gpu0'"]),
    ({**PADDLE, "PADDLE_TRAINER_ID": "4"}, ["PADDLE_TRAINER_ID=4", "PADDLE_TRAINERS_NUM=4"]),
    ({**PADDLE, "PADDLE_TRAINER_ID": "three"}, ["PADDLE_TRAINER_ID='three'", "not an integer"]),
    ({"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "2"}, ["PADDLE_TRAINER_ENDPOINTS", "fleetlite launch"]),
    ({**PADDLE, "PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "3"}, ["lists 4 endpoints", "PADDLE_TRAINERS_NUM=3"]),
    ({**PADDLE, "PADDLE_TRAINER_ENDPOINTS": "a:1,b:2,c:3,nohost"}, ["nohost", "HOST:PORT"]),
    ({**PADDLE, "PADDLE_CURRENT_ENDPOINT": "10.0.0.9:1"}, ["PADDLE_CURRENT_ENDPOINT=10.0.0.9:1", "differs"]),
]


@pytest.mark.parametrize("env,words", BAD, ids=[" ".join(w[:1]) for _, w in BAD])
def test_bad_variables_raise_a_clear_error(env, words):
    with pytest.raises(DistEnvError) as info:
        read_env(env)
    for w in words:
        assert w in str(info.value)
    assert isinstance(info.value, ValueError)


def test_init_parallel_env_checks_the_variables_before_starting(clean_dist_env):
    clean_dist_env.setenv("RANK", "3")
    clean_dist_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistEnvError, match="RANK=3"):
        dist.init_parallel_env()
    assert not dist.is_initialized()


# ---- ParallelEnv -------------------------------------------------------------------------------------------------

def test_parallel_env_reports_the_launchers_view(clean_dist_env):
    for k, v in {**TORCHRUN, "FLAGS_selected_gpus": "0"}.items():
        clean_dist_env.setenv(k, v)
    pe = ParallelEnv()
    assert (pe.rank, pe.world_size, pe.nranks, pe.local_rank, pe.device_id) == (1, 2, 2, 1, 0)
    assert pe.trainer_endpoints == ["10.0.0.5:29401", "10.0.0.5:29402"]
    assert pe.current_endpoint == "10.0.0.5:29402"
    assert pe.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_parallel_env_single_process(clean_dist_env):
    pe = ParallelEnv()
    assert (pe.rank, pe.world_size, pe.nranks, pe.local_rank, pe.device_id) == (0, 1, 1, 0, 0)


# ---- backend, timeout and the single-process path ----------------------------------------------------------------

def test_unknown_backend_is_rejected(clean_dist_env):
    with pytest.raises(ValueError, match="unknown backend 'mpi'.*auto, gloo, nccl"):
        dist.init_parallel_env(backend="mpi")


@NO_CUDA
def test_nccl_without_cuda_is_rejected(clean_dist_env):
    with pytest.raises(ValueError, match="needs CUDA.*backend='gloo'"):
        dist.init_parallel_env(backend="nccl")
    clean_dist_env.setenv("PADDLE_DISTRI_BACKEND", "nccl")  # what spawn(backend="nccl") exports
    with pytest.raises(DistEnvError, match="PADDLE_DISTRI_BACKEND='nccl'.*needs CUDA"):
        dist.init_parallel_env()


@pytest.mark.parametrize("raw", ["soon", "0", "-5"])
def test_bad_collective_timeout_is_rejected(clean_dist_env, raw):
    clean_dist_env.setenv("FLEETLITE_COLLECTIVE_TIMEOUT", raw)
    with pytest.raises(DistEnvError, match=f"FLEETLITE_COLLECTIVE_TIMEOUT='{raw}'"):
        dist.init_parallel_env()


def test_collective_timeout_default_and_override(clean_dist_env):
    assert dist.default_timeout() == datetime.timedelta(seconds=600)
    clean_dist_env.setenv("FLEETLITE_COLLECTIVE_TIMEOUT", "7.5")
    assert dist.default_timeout() == datetime.timedelta(seconds=7.5)
    with pytest.raises(ValueError, match="timeout=-1"):
        dist.init_parallel_env(timeout=-1)


def test_world_size_one_warns_once_and_runs_single_process(clean_dist_env):
    clean_dist_env.setattr(collective, "_warned_single", False)
    clean_dist_env.setenv("RANK", "0")
    clean_dist_env.setenv("WORLD_SIZE", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dist.init_parallel_env() is None
        assert dist.init_parallel_env() is None
    assert [str(w.message) for w in caught] == [
        "fleetlite: world size is 1, running single-process (no process group created)"]
    assert not dist.is_initialized()
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
    t = torch.arange(3.0)
    assert dist.all_reduce(t) is None and torch.equal(t, torch.arange(3.0))
    assert dist.broadcast(t, src=0) is None and torch.equal(t, torch.arange(3.0))
    assert dist.all_gather_object({"a": 1}) == [{"a": 1}]
    dist.barrier()


# ---- real process groups (2 ranks, gloo) -------------------------------------------------------------------------

def _group_from_torchrun_env(rank, world_size):
    group = tdist.group.WORLD
    again = dist.init_parallel_env()  # run_ranks already initialised: must return the same group
    t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
    dist.all_reduce(t)
    b = torch.tensor([float(rank)])
    dist.broadcast(b, src=1)
    dist.barrier()
    pe = ParallelEnv()
    return {"same_group": again is group, "initialized": dist.is_initialized(), "backend": tdist.get_backend(),
            "rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.tolist(), "bcast": b.item(),
            "gathered": dist.all_gather_object(("r", rank)), "pe": (pe.rank, pe.nranks, pe.local_rank),
            "endpoints": pe.trainer_endpoints, "current": pe.current_endpoint}


@pytest.mark.timeout(60)
def test_process_group_from_torchrun_variables_is_idempotent_and_reduces():
    out = run_ranks(_group_from_torchrun_env, world_size=2)
    for rank, r in enumerate(out):
        assert r["same_group"] and r["initialized"] and r["backend"] == "gloo"
        assert (r["rank"], r["world"], r["pe"]) == (rank, 2, (rank, 2, rank))
        assert r["sum"] == [3.0, 30.0]  # (1 + 2), (10 + 20)
        assert r["bcast"] == 1.0
        assert r["gathered"] == [("r", 0), ("r", 1)]
        assert len(r["endpoints"]) == 2 and r["current"] == r["endpoints"][rank]


def _group_from_paddle_env(rank, world_size, port):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    eps = [f"127.0.0.1:{port + i}" for i in range(world_size)]
    os.environ.update({"PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(world_size),
                       "PADDLE_TRAINER_ENDPOINTS": ",".join(eps), "PADDLE_CURRENT_ENDPOINT": eps[rank]})
    group = dist.init_parallel_env(backend="gloo")
    t = torch.tensor([2.0 ** rank])
    dist.all_reduce(t)
    return {"group": group is tdist.group.WORLD, "rank": tdist.get_rank(), "world": tdist.get_world_size(),
            "sum": t.item(), "master": (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
            "pe": (ParallelEnv().rank, ParallelEnv().local_rank, ParallelEnv().current_endpoint)}


@pytest.mark.timeout(60)
def test_process_group_from_paddle_variables_only():
    port = free_port()
    out = run_ranks(_group_from_paddle_env, world_size=2, args=(port,), init=False)
    for rank, r in enumerate(out):
        assert r["group"] and (r["rank"], r["world"]) == (rank, 2)
        assert r["sum"] == 3.0  # 2**0 + 2**1
        assert r["master"] == ("127.0.0.1", str(port))  # rank 0's endpoint
        assert r["pe"] == (rank, rank, f"127.0.0.1:{port + rank}")


def _one_rank_never_joins(rank, world_size, marker):
    if rank == 1:  # alive but never reaches the collective; leaves once rank 0 has reported
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None
    try:
        dist.all_reduce(torch.ones(1))
        error = None
    except Exception as e:  # noqa: BLE001 - the test inspects what came out
        error = (type(e).__name__, str(e))
    with open(marker, "w"):
        pass
    return {"error": error}


@pytest.mark.timeout(60)
def test_collective_timeout_turns_a_missing_peer_into_an_error(tmp_path):
    timeout_s = 3.0
    # expect_failure: rank 0's all_reduce is one rank 1 never matches, which run_ranks otherwise reports
    out = run_ranks(_one_rank_never_joins, world_size=2, args=(str(tmp_path / "reported"),),
                    env={"FLEETLITE_COLLECTIVE_TIMEOUT": str(timeout_s)}, timeout=50, expect_failure=True)
    assert out[1] == ("ok", None), out
    status, survivor = out[0]
    assert status == "ok", survivor
    assert survivor["error"] is not None, "all_reduce returned although rank 1 never joined"
    name, message = survivor["error"]
    assert name == "CollectiveError"
    assert "all_reduce failed on rank 0 of 2" in message and "(3 s)" in message
    assert "FLEETLITE_COLLECTIVE_TIMEOUT" in message
    # it waited for the configured timeout, not an instant failure nor the 600 s default: gloo's own words
    # (an order of events rather than a measured duration, which load stretches)
    assert f"Timed out waiting {int(timeout_s * 1000)}ms" in message


def test_docstring_examples_run(clean_dist_env):
    import doctest

    from fleetlite.distributed import env

    result = doctest.testmod(env)
    assert result.attempted >= 4 and result.failed == 0
