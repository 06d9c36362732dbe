"""The peer monitor (Note [peer monitor]), exercised on gloo: it is off for gloo groups by default (gloo's own
errors are unchanged), and when forced on it names a raising or dead peer while the job runs, ignores peers that
shut down cleanly, and makes the survivor's collective error carry its message. On NCCL it also aborts the group
(tests/gpu/)."""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as tdist

import fleetlite.distributed as dist
from fleetlite.distributed import faults, monitor
from fleetlite.testing import run_ranks, timeout_scale

FORCED = {"FLEETLITE_PEER_MONITOR": "1"}


def _default_is_off(rank, world):
    return monitor._monitor is None


@pytest.mark.timeout(120)
def test_gloo_groups_get_no_monitor_by_default():
    assert run_ranks(_default_is_off, world_size=2, timeout=100) == [True, True]


def _peer_raises(rank, world):
    store = tdist.distributed_c10d._get_default_store()
    aborted = []
    monitor._monitor.abort = lambda: aborted.append(True)  # gloo: record instead of aborting
    dist.barrier()
    if rank == 1:
        faults.record_rank_error(ValueError("boom on rank 1"))
        # alive, but gone from the job's point of view, until rank 0 has seen the alarm (or gave up waiting)
        store.wait(["test/rank0_done"], datetime.timedelta(seconds=60 * timeout_scale()))
        return None
    deadline = time.monotonic() + 10 * timeout_scale()  # a hang guard (Note [test timeouts]), not a measure
    while not aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    error = monitor._monitor.error if monitor._monitor else None
    try:  # a collective after the alarm raises the monitor's error (here: gloo fails on its own)
        faults.peer_lost_error("all_reduce", RuntimeError("gloo: connection closed by peer"))
        same = str(faults.peer_lost_error("x", RuntimeError("y"))) == str(error)
    finally:
        faults._monitor_error = None
        store.set("test/rank0_done", "1")
    return bool(aborted), str(error), dict(error.lost or {}) if error else None, same


@pytest.mark.timeout(120)
def test_forced_monitor_names_a_raising_peer_while_it_is_still_alive():
    out = run_ranks(_peer_raises, world_size=2, timeout=100, env=FORCED)
    aborted, message, lost, same = out[0]
    # the order of events: the alarm came while rank 1 was still alive (it waits for rank 0), as a raise
    assert aborted and lost == {1: "raised"} and "rank 1 raised ValueError: boom on rank 1" in message
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
    monitor._monitor.abort = lambda: aborted.append(True)
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), 9)
    deadline = time.monotonic() + 10 * timeout_scale()  # a hang guard (Note [test timeouts]), not a measure
    while not aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    error = monitor._monitor.error
    faults._monitor_error = None
    return bool(aborted), dict(error.lost or {}) if error else None


@pytest.mark.timeout(120)
def test_forced_monitor_names_a_killed_peer():
    out = run_ranks(_peer_dies, world_size=2, timeout=100, env=FORCED, expect_failure=True)
    status, (aborted, lost) = out[0]
    assert status == "ok" and aborted and lost == {1: "died"}
