"""The peer monitor (Note [peer monitor]), exercised on gloo: it is off for gloo groups by default (gloo's own
errors are unchanged), and when forced on it names a raising or dead peer within a second, ignores peers that
shut down cleanly, and makes the survivor's collective error carry its message. On NCCL it also aborts the group
(tests/gpu/)."""

from __future__ import annotations

import os
import time

import pytest
import torch

import fleetlite.distributed as dist
from fleetlite.distributed import faults, monitor
from fleetlite.testing import run_ranks

FORCED = {"FLEETLITE_PEER_MONITOR": "1"}


def _default_is_off(rank, world):
    return monitor._monitor is None


@pytest.mark.timeout(120)
def test_gloo_groups_get_no_monitor_by_default():
    assert run_ranks(_default_is_off, world_size=2, timeout=100) == [True, True]


def _peer_raises(rank, world):
    aborted = []
    monitor._monitor.abort = lambda: aborted.append(time.monotonic())  # gloo: record instead of aborting
    dist.barrier()
    start = time.monotonic()
    if rank == 1:
        faults.record_rank_error(ValueError("boom on rank 1"))
        time.sleep(4)  # alive, but gone from the job's point of view
        return None
    deadline = start + 10
    while not aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    error = monitor._monitor.error if monitor._monitor else None
    try:  # a collective after the alarm raises the monitor's error (here: gloo fails on its own)
        faults.peer_lost_error("all_reduce", RuntimeError("gloo: connection closed by peer"))
        same = str(faults.peer_lost_error("x", RuntimeError("y"))) == str(error)
    finally:
        faults._monitor_error = None
    return (aborted[0] - start if aborted else None), str(error), dict(error.lost or {}), same


@pytest.mark.timeout(120)
def test_forced_monitor_names_a_raising_peer_within_a_second():
    out = run_ranks(_peer_raises, world_size=2, timeout=100, env=FORCED)
    seconds, message, lost, same = out[0]
    assert seconds is not None and seconds < 1.0 + monitor.MONITOR_INTERVAL_S + faults.GRACE_S
    assert lost == {1: "raised"} and "rank 1 raised ValueError: boom on rank 1" in message
    assert message.startswith("a collective failed on rank 0 of 2") and same


def _finish_at_different_times(rank, world):
    aborted = []
    monitor._monitor.abort = lambda: aborted.append(1)
    t = torch.ones(1)
    for _ in range(20):
        dist.all_reduce(t)
    if rank == 1:
        dist.destroy_process_group()  # a clean shutdown: writes done/1, then the process may go
        return None
    time.sleep(2.0)  # rank 1 is long done: not a loss
    return aborted, monitor._monitor.error


@pytest.mark.timeout(120)
def test_a_peer_that_shut_down_cleanly_is_not_a_loss():
    aborted, error = run_ranks(_finish_at_different_times, world_size=2, timeout=100, env=FORCED)[0]
    assert aborted == [] and error is None


def _peer_dies(rank, world):
    aborted = []
    monitor._monitor.abort = lambda: aborted.append(time.monotonic())
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), 9)
    start = time.monotonic()
    while not aborted and time.monotonic() < start + 10:
        time.sleep(0.05)
    error = monitor._monitor.error
    faults._monitor_error = None
    return (aborted[0] - start if aborted else None), dict(error.lost or {}) if error else None


@pytest.mark.timeout(120)
def test_forced_monitor_names_a_killed_peer():
    out = run_ranks(_peer_dies, world_size=2, timeout=100, env=FORCED, expect_failure=True)
    status, (seconds, lost) = out[0]
    assert status == "ok" and seconds is not None and seconds < 5 and lost == {1: "died"}
