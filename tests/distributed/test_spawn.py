"""fleetlite.distributed.spawn: real processes (default start method), results and failures."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

import fleetlite.distributed as dist
from fleetlite.distributed.spawn import SpawnError, _paddle_options

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")


def _all_reduce_rank(out_dir, scale):
    torch.set_num_threads(1)
    dist.init_parallel_env(backend="gloo")
    rank = dist.get_rank()
    t = torch.tensor([scale * (rank + 1)])
    dist.all_reduce(t)
    record = {"rank": rank, "world": dist.get_world_size(), "sum": t.item(), "pid": os.getpid(),
              "paddle_id": os.environ["PADDLE_TRAINER_ID"], "paddle_num": os.environ["PADDLE_TRAINERS_NUM"],
              "endpoints": os.environ["PADDLE_TRAINER_ENDPOINTS"].split(",")}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_spawn_two_ranks_all_reduce(tmp_path):
    dist.spawn(_all_reduce_rank, args=(str(tmp_path), 0.5), nprocs=2)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, r in enumerate(records):
        assert (r["rank"], r["world"]) == (rank, 2)
        assert r["sum"] == 1.5  # 0.5 * (1 + 2)
        assert (r["paddle_id"], r["paddle_num"]) == (str(rank), "2")
        assert len(r["endpoints"]) == 2
    assert records[0]["pid"] != records[1]["pid"] != os.getpid()


def _rank_one_fails(out_dir):
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    if rank == 0:
        with open(os.path.join(out_dir, "pid0"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)  # would outlive the test if spawn did not stop it
        return
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(out_dir, "pid0")) and time.monotonic() < deadline:
        time.sleep(0.05)
    raise ValueError("rank one fails on purpose")


@pytest.mark.timeout(60)
def test_spawn_failure_names_the_rank_with_its_traceback_and_stops_the_others(tmp_path):
    with pytest.raises(SpawnError) as info:
        dist.spawn(_rank_one_fails, args=(str(tmp_path),), nprocs=2)
    err = info.value
    assert err.rank == 1
    message = str(err)
    assert message.startswith("rank 1 of 2 raised an exception")
    assert "ValueError: rank one fails on purpose" in message
    assert "_rank_one_fails" in message and "Traceback" in message  # the child's traceback
    pid0 = int((tmp_path / "pid0").read_text())
    with pytest.raises(ProcessLookupError):  # rank 0 was stopped (and reaped), not left sleeping
        os.kill(pid0, 0)


def test_spawn_rejects_bad_arguments_before_starting():
    with pytest.raises(ValueError, match="nprocs=0"):
        dist.spawn(_all_reduce_rank, nprocs=0)
    with pytest.raises(TypeError, match=r"unknown options \['nproc'\]"):
        dist.spawn(_all_reduce_rank, nprocs=2, nproc=2)
    with pytest.raises(TypeError, match="needs a callable"):
        dist.spawn("train", nprocs=2)
    with pytest.raises(SpawnError, match="module level"):
        dist.spawn(lambda: None, nprocs=2)
    with pytest.raises(ValueError, match="fleetlite launch --nnodes"):
        dist.spawn(_all_reduce_rank, nprocs=2, ips="10.0.0.1,10.0.0.2")
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        dist.spawn(_all_reduce_rank, nprocs=2, backend="mpi")
    with pytest.raises(ValueError, match="more processes than selected GPUs"):
        dist.spawn(_all_reduce_rank, nprocs=3, gpus="0,1")


@NO_CUDA
def test_spawn_nccl_without_cuda_fails_in_the_parent():
    with pytest.raises(ValueError, match="needs CUDA"):
        dist.spawn(_all_reduce_rank, nprocs=2, backend="nccl")


def test_paddle_spawn_options_map_to_variables():
    assert _paddle_options({"gpus": "2,3", "backend": "GLOO", "ips": "127.0.0.1"}, -1) == (
        2, {"PADDLE_DISTRI_BACKEND": "gloo", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert _paddle_options({"gpus": "0,1,2"}, 2) == (2, {"CUDA_VISIBLE_DEVICES": "0,1,2"})
    assert _paddle_options({}, 4) == (4, {})
    with pytest.raises(ValueError, match="comma-separated list of GPU indices"):
        _paddle_options({"gpus": "gpu0"}, -1)


def test_default_process_count_is_one_per_gpu_else_one_per_core(monkeypatch):
    import importlib

    spawn_mod = importlib.import_module("fleetlite.distributed.spawn")  # the package's `spawn` is the function
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert spawn_mod._default_nprocs() == 3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert spawn_mod._default_nprocs() == 8


def test_visible_gpus_are_set_before_the_child_imports_anything(tmp_path, clean_dist_env):
    from spawn_probe import record

    clean_dist_env.setenv("CUDA_VISIBLE_DEVICES", "7")  # the parent's own value comes back afterwards
    dist.spawn(record, args=(str(tmp_path),), nprocs=2, gpus="2,3", backend="gloo")
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, s in enumerate(seen):
        assert s["at_import"]["CUDA_VISIBLE_DEVICES"] == "2,3"  # at import, not only once func runs
        assert s["at_import"]["PADDLE_DISTRI_BACKEND"] == "gloo"
        assert s["selected"] == str(rank)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7" and "PADDLE_DISTRI_BACKEND" not in os.environ


def test_children_do_not_inherit_an_enclosing_launchers_variables(tmp_path, clean_dist_env):
    from spawn_probe import record

    # what torchrun gives a worker of a one-process launch: with it a child would wait for the agent's store
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_USE_AGENT_STORE": "True",
                 "GROUP_RANK": "0"}.items():
        clean_dist_env.setenv(k, v)
    dist.spawn(record, args=(str(tmp_path),), nprocs=2)
    for r in range(2):
        s = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert s["at_import"]["TORCHELASTIC_RUN_ID"] is None and s["agent_store"] is None
        assert s["at_import"]["GROUP_RANK"] is None
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the parent keeps its own


def test_spawn_inside_a_multi_process_job_is_refused_at_once(clean_dist_env):
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        clean_dist_env.setenv(k, v)
    started = []  # "at once": refused before any process starts (an order of events, not a duration)
    clean_dist_env.setattr(torch.multiprocessing, "start_processes", lambda *a, **k: started.append(a))
    with pytest.raises(SpawnError, match=r"rank 1 of a job of 2 processes.*call the function directly") as info:
        dist.spawn(_all_reduce_rank, args=("unused", 1.0), nprocs=2)
    assert "\n" not in str(info.value) and started == []


def test_master_port_is_below_the_kernels_ephemeral_range_and_free():
    """Note [master port]: a port the kernel never hands to an outgoing connection, free when picked."""
    import socket

    from fleetlite.distributed.spawn import _ephemeral_low, find_free_port

    low = _ephemeral_low()
    ports = {find_free_port() for _ in range(20)}
    assert all(low - 12000 <= p < low for p in ports) and len(ports) > 1
    for p in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", p))  # still free
