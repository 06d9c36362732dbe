"""Checkpoints hold the CUDA RNG state of the rank's own device and restore it onto the rank's device, whatever
its index (another CUDA_VISIBLE_DEVICES on resume). torch.cuda is mocked; tests/gpu/ saves and resumes for real."""

from __future__ import annotations

import torch

from fleetlite.checkpoint import capture_rng_state, restore_rng_state


def _fake_cuda(env, count, calls):
    env.setattr(torch.cuda, "is_available", lambda: True)
    env.setattr(torch.cuda, "is_initialized", lambda: True)
    env.setattr(torch.cuda, "device_count", lambda: count)
    env.setattr(torch.cuda, "get_rng_state", lambda device: calls.append(("get", device)) or torch.tensor([7, 7]))
    env.setattr(torch.cuda, "set_rng_state", lambda state, device: calls.append(("set", device, state.tolist())))
    env.setattr(torch.cuda, "set_rng_state_all", lambda states: calls.append(("set_all", len(states))))


def test_the_ranks_own_cuda_rng_is_saved_and_restored_on_another_device_index(clean_dist_env):
    calls = []
    clean_dist_env.setenv("FLAGS_selected_gpus", "1")  # this rank works on GPU 1 of 2
    _fake_cuda(clean_dist_env, 2, calls)
    state = capture_rng_state()
    assert calls == [("get", torch.device("cuda", 1))] and state["cuda_device"].tolist() == [7, 7]
    assert "cuda" not in state  # not every device's state: only the rank's own
    calls.clear()
    clean_dist_env.setenv("FLAGS_selected_gpus", "0")  # resumed with CUDA_VISIBLE_DEVICES=<that GPU>: one device
    _fake_cuda(clean_dist_env, 1, calls)
    restore_rng_state(state)
    assert calls == [("set", torch.device("cuda", 0), [7, 7])]  # restored, not skipped


def test_older_checkpoints_with_every_devices_state_still_restore(clean_dist_env):
    calls = []
    _fake_cuda(clean_dist_env, 2, calls)
    state = {**capture_rng_state(), "cuda": [torch.tensor([1]), torch.tensor([2])]}
    del state["cuda_device"]
    calls.clear()
    restore_rng_state(state)
    assert calls == [("set_all", 2)]
