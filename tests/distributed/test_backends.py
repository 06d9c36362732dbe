"""Backend choice on a (simulated) CUDA machine: per-device backends, the gloo fallback, the device of small
collectives. torch.cuda is mocked where a GPU would be needed; the group itself is never created here
(tests/gpu/ runs the real thing)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as tdist

import fleetlite.distributed as dist
from fleetlite.distributed import ParallelEnv, collective
from fleetlite.distributed.collective import collective_device
from fleetlite.distributed.env import PER_DEVICE_BACKEND, DistEnvError, choose_backend
from fleetlite.testing import run_ranks


class _Stop(Exception):
    pass


@pytest.mark.parametrize("requested, gpus, local, expected", [
    ("auto", 0, 2, "gloo"), ("gloo", 4, 2, "gloo"), ("gloo", 1, 4, "gloo"),
    ("auto", 2, 2, PER_DEVICE_BACKEND), ("nccl", 8, 2, PER_DEVICE_BACKEND), ("auto", 1, 1, PER_DEVICE_BACKEND),
])
def test_backend_string_per_device_with_cuda_gloo_without(requested, gpus, local, expected):
    assert choose_backend(requested, gpus, local) == (expected, None)


def test_more_local_ranks_than_gpus_auto_falls_back_to_gloo_with_one_line():
    backend, note = choose_backend("auto", 1, 2)
    assert backend == "gloo"
    assert "2 ranks" in note and "1 visible GPU" in note and "\n" not in note


def test_more_local_ranks_than_gpus_nccl_is_an_error_naming_both_numbers():
    with pytest.raises(DistEnvError, match=r"runs 3 ranks.*sees 2 GPU"):
        choose_backend("nccl", 2, 3)
    with pytest.raises(ValueError, match="needs CUDA"):
        choose_backend("nccl", 0, 1)


def _fake_cuda(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.append(torch.device(d)))
    return chosen


def _capture_init(monkeypatch):
    seen = {}

    def fake_init(**kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(collective.tdist, "init_process_group", lambda **kw: fake_init(**kw))
    return seen


def _launched(env, rank, world, local_world=None):
    for k, v in {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": local_world or world,
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29999}.items():
        env.setenv(k, str(v))


@pytest.mark.parametrize("backend", ["auto", "nccl"])
def test_init_on_cuda_uses_per_device_backends_and_keeps_device_id(clean_dist_env, backend):
    chosen = _fake_cuda(clean_dist_env, 2)
    seen = _capture_init(clean_dist_env)
    _launched(clean_dist_env, 1, 2)
    with pytest.raises(_Stop):
        dist.init_parallel_env(backend=backend)
    assert seen["backend"] == "cpu:gloo,cuda:nccl"
    assert seen["device_id"] == torch.device("cuda", 1) == ParallelEnv().device
    assert chosen == [torch.device("cuda", 1)]  # set once, by init, to ParallelEnv().device


def test_init_with_more_ranks_than_gpus_falls_back_or_refuses(clean_dist_env):
    clean_dist_env.setattr(collective, "_warned_once", set())
    _fake_cuda(clean_dist_env, 1)
    seen = _capture_init(clean_dist_env)
    for rank, lines in ((1, 0), (0, 1)):  # one line per node, from its local rank 0
        _launched(clean_dist_env, rank, 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(_Stop):
                dist.init_parallel_env()
        assert seen["backend"] == "gloo" and "device_id" not in seen
        assert [str(w.message).count("\n") for w in caught] == [0] * lines
    assert "1 visible GPU" in str(caught[0].message)
    seen.clear()
    with pytest.raises(DistEnvError, match=r"runs 2 ranks.*sees 1 GPU"):
        dist.init_parallel_env(backend="nccl")
    assert seen == {}  # refused before any group was started


def test_plain_single_process_run_is_quiet(clean_dist_env):
    clean_dist_env.setattr(collective, "_warned_single", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dist.init_parallel_env() is None


def test_served_device_types_come_from_the_backend_config(monkeypatch):
    monkeypatch.setattr(collective.tdist, "get_backend_config", lambda group=None: "cpu:gloo,cuda:nccl")
    assert collective._served_device_types() == {"cpu", "cuda"}
    monkeypatch.setattr(collective.tdist, "get_backend_config", lambda group=None: "cuda:nccl")
    assert collective._served_device_types() == {"cuda"}


def test_small_collective_device_follows_the_tensor(monkeypatch):
    monkeypatch.setattr(collective, "is_initialized", lambda: True)
    monkeypatch.setattr(collective.tdist, "get_backend_config", lambda group=None: "cpu:gloo,cuda:nccl")
    assert collective_device("cpu") == torch.device("cpu")  # a CPU metric sum stays on the CPU (gloo)
    assert collective_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    monkeypatch.setattr(collective.tdist, "get_backend_config", lambda group=None: "cuda:nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert collective_device("cpu") == torch.device("cuda", 3)  # a pure NCCL group made by the user


def test_cpu_model_under_a_gpu_job_warns_once(monkeypatch):
    monkeypatch.setattr(collective, "_warned_once", set())
    monkeypatch.setattr(collective, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        collective.warn_if_cpu_model(torch.nn.Linear(2, 2))
        collective.warn_if_cpu_model(torch.nn.Linear(2, 2))
    assert len(caught) == 1 and "model is on the CPU" in str(caught[0].message)


def _cpu_collectives(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return str(tdist.get_backend_config()), str(collective_device(t.device)), t.item()


@pytest.mark.timeout(120)
def test_gloo_group_serves_cpu_tensors_on_cpu():
    for config, device, total in run_ranks(_cpu_collectives, world_size=2, timeout=100):
        assert "cpu:gloo" in config and device == "cpu" and total == 3.0
