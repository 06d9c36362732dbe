"""Helpers to test multi-process behaviour with real processes and a hard timeout.

``run_ranks`` runs a function on N ranks (gloo, CPU, one thread each) and
returns every rank's result; an exception on any rank is re-raised naming the
rank, and a hang becomes a ``TimeoutError`` with every process killed.
``run_launch`` runs ``fleetlite launch ...`` as a subprocess, also bounded.

Example::

    def check(rank, world_size):
        t = torch.ones(1) * (rank + 1)
        torch.distributed.all_reduce(t)
        return t.item()

    assert run_ranks(check, world_size=2) == [3.0, 3.0]
"""

from __future__ import annotations

import io
import multiprocessing as _mp
import os
import pickle
import queue
import random
import signal
import subprocess
import sys
import time
import traceback
import warnings

import torch

from . import distributed as dist
from .distributed.spawn import find_free_port, worker_env

__all__ = ["run_ranks", "run_launch", "RankFailure", "free_port", "timeout_scale"]


class RankFailure(AssertionError):
    """A rank raised; the message holds its rank and traceback.

    Example::

        with pytest.raises(RankFailure, match="rank 1 failed"):
            run_ranks(fails_on_rank_one)
    """

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


def timeout_scale() -> float:
    """How much longer than written every test timeout runs: ``FLEETLITE_TEST_TIMEOUT_SCALE`` (default 1).

    Timeouts catch hangs; on a loaded machine a correct test runs several times slower, so the suite's
    conftest raises this scale with the machine's load (see tests/conftest.py).
    """
    try:
        return max(float(os.environ.get("FLEETLITE_TEST_TIMEOUT_SCALE", "1")), 1.0)
    except ValueError:
        return 1.0


def free_port() -> int:
    return find_free_port()


_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "fleetlite.distributed"]
_SERVERS: dict[int, object] = {}  # rank -> its fork server
_HASH_BASE = random.SystemRandom().randrange(2**32 - 1)  # this session's; rank r's servers get base + r


def _context():
    return _mp.get_context("forkserver")


def _server(rank: int):
    """Rank ``rank``'s fork server: a process that imported torch once, every rank ``rank`` a cheap fork of it.

    One server per rank index, each started with its own ``PYTHONHASHSEED``: ranks forked from one server
    would share its string hashes (set and dict-of-str orders alike on every rank), which real launches
    do not give, and a bug that needs them alike would pass here.
    """
    from multiprocessing import forkserver

    server = _SERVERS.get(rank)
    if server is None:
        server = _SERVERS[rank] = forkserver.ForkServer()
        server.set_forkserver_preload(_PRELOAD)
        saved = os.environ.get("PYTHONHASHSEED")
        os.environ["PYTHONHASHSEED"] = str((_HASH_BASE + rank) % (2**32 - 1) + 1)  # distinct per rank, never 0
        try:
            server.ensure_running()
        finally:
            if saved is None:
                del os.environ["PYTHONHASHSEED"]
            else:
                os.environ["PYTHONHASHSEED"] = saved
    return server


def _servers_ready(world_size: int) -> None:
    """Start the servers of ranks ``0..world_size-1`` (their imports run side by side) and wait until each has
    forked once: ranks then start together, as a short rendezvous timeout in a test expects."""
    new = [r for r in range(world_size) if r not in _SERVERS]
    for r in new:
        _server(r)
    for r in new:
        probe = _context().Process(target=os.getpid, daemon=True)
        _start(probe, r)
        probe.join()


def _start(proc, rank: int) -> None:
    """``proc.start()`` through rank ``rank``'s fork server (multiprocessing knows one per process)."""
    from multiprocessing import forkserver

    connect = forkserver.connect_to_new_process
    forkserver.connect_to_new_process = _server(rank).connect_to_new_process
    try:
        proc.start()
    finally:
        forkserver.connect_to_new_process = connect


def _count_p2p() -> dict[int, int]:
    """Count point-to-point operations per process group (they advance a group's sequence number too)."""
    pg_class = torch._C._distributed_c10d.ProcessGroup
    counts: dict[int, int] = {}

    def counting(name):
        inner = getattr(pg_class, name)

        def op(self, *args, **kwargs):
            counts[id(self)] = counts.get(id(self), 0) + 1
            return inner(self, *args, **kwargs)
        return op

    for name in ("send", "recv", "recv_anysource"):
        if hasattr(pg_class, name):
            setattr(pg_class, name, counting(name))
    return counts


def _collectives_issued(p2p: dict[int, int]) -> dict[str, int]:
    """Collectives this rank issued on each process group it belongs to, by the group's name."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return {}
    from torch.distributed import distributed_c10d as c10d

    issued = {}
    for group, name in list(c10d._world.pg_names.items()):
        try:  # gloo only: its sequence number counts point-to-point operations too, NCCL's counts them apart
            if c10d.get_backend(group) == "gloo":
                issued[name] = group._get_sequence_number_for_group() - p2p.get(id(group), 0)
        except Exception:  # noqa: BLE001 - a group without sequence numbers: not checked
            continue
    return issued


def _default_store():
    """The job's store while a default process group exists, else None."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


def _leave_together(rank: int, world_size: int, store=None) -> None:
    """Rank 0 hosts the job's store: it stays until every rank is done with it.

    A rank that finishes early (a refusal, say) would otherwise take the store down while its peers are still
    building their groups through it ("Connection reset by peer" on those ranks). ``store`` is the one kept
    from the start, for a rank whose ``fn`` destroyed its process group itself (a clean shutdown): it still
    says it is done, rather than leaving rank 0 waiting out the whole timeout. Bounded by the load-scaled
    timeout; a rank that never arrives (killed on purpose) only delays rank 0's exit.
    """
    store = _default_store() or store
    if store is None:
        return
    key = "fleetlite/testing/done"
    try:
        store.add(key, 1)
        if rank == 0:
            deadline = time.monotonic() + 30.0 * timeout_scale()
            while store.add(key, 0) < world_size and time.monotonic() < deadline:
                time.sleep(0.02)
    except Exception:  # noqa: BLE001 - the store is already gone: nothing to wait for
        pass


def _rank_main(rank, world_size, port, fn, args, kwargs, results, env, init, filters, linger=True):
    # the parent's environment and warning filters of this moment, not the fork server's of its start
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(worker_env(rank, world_size, "127.0.0.1", port))
    warnings.filters[:] = filters
    warnings._filters_mutated()
    torch.set_num_threads(1)
    p2p = _count_p2p()
    store = None
    try:
        if init:
            dist.init_parallel_env(backend="gloo")
            store = _default_store()
        out = fn(rank, world_size, *args, **kwargs)
        # serialise here: tensors sent through the queue as shared memory die with this process
        buf = io.BytesIO()
        torch.save(out, buf)
        results.put((rank, "ok", (buf.getvalue(), _collectives_issued(p2p))))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if linger:
            _leave_together(rank, world_size, store)
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _picklable(filters) -> list:
    keep = []
    for f in filters:
        try:
            pickle.dumps(f)
        except Exception:  # noqa: BLE001 - a filter on a class defined in a test: left out
            continue
        keep.append(f)
    return keep


def run_ranks(fn, world_size: int = 2, args=(), kwargs=None, timeout: float = 120.0,
              env: dict[str, str] | None = None, init: bool = True, expect_failure: bool = False):
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` processes.

    ``fn`` must be importable (module level). The process group (gloo) is
    initialised before ``fn`` runs unless ``init=False``. Returns the list of
    return values by rank. With ``expect_failure=True`` returns a dict
    ``{rank: ("ok", value) | ("error", text)}`` instead of raising, for tests
    that check how ranks fail.

    Each rank starts with this process's environment as it is now (updated
    with ``env``), its warning filters (the suite's ``error::Warning:fleetlite``
    holds inside ranks too) and a hash seed of its own. Unless
    ``expect_failure``, it is also a failure when ranks did not issue the same
    number of collectives on a group they share (one rank's collective, e.g. an
    async one never waited on, was never matched), or when a rank that
    returned its result then exits with a non-zero code or does not exit.
    """
    timeout = timeout * timeout_scale()
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    rank_env = {**os.environ, **(env or {})}
    filters = _picklable(warnings.filters)
    procs = [
        ctx.Process(target=_rank_main, args=(r, world_size, port, fn, tuple(args), dict(kwargs or {}),
                                              results, rank_env, init, filters, not expect_failure), daemon=True)
        for r in range(world_size)
    ]
    _servers_ready(world_size)
    for r, p in enumerate(procs):
        _start(p, r)
    deadline = time.monotonic() + timeout
    got: dict[int, tuple[str, object]] = {}
    try:
        while len(got) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world_size)) - set(got))
                raise TimeoutError(f"ranks {missing} did not finish within {timeout:.0f} s (hang?); "
                                   f"finished: {sorted(got)}")
            try:
                rank, status, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                # a rank that exited without reporting (killed, or os._exit) never will
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in got]
                if dead:
                    # a rank died without reporting (killed): let the others report for a moment
                    time.sleep(0.5)
                    while True:
                        try:
                            rank, status, value = results.get_nowait()
                            got[rank] = (status, value)
                        except queue.Empty:
                            break
                    for r in dead:
                        got.setdefault(r, ("error", f"process exited with code {procs[r].exitcode} without "
                                                    "returning a result"))
                    if not expect_failure:
                        break
                continue
            got[rank] = (status, value)
            if status == "error" and not expect_failure:
                break
        if not expect_failure and all(s == "ok" for s, _ in got.values()):
            _check_exits(procs, deadline, timeout)
    finally:
        for p in procs:
            p.join(timeout=5 if len(got) == world_size else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    if expect_failure:
        return {r: (s, _decode(v[0]) if s == "ok" else v) for r, (s, v) in got.items()}
    for rank in sorted(got):
        status, value = got[rank]
        if status == "error":
            raise RankFailure(f"rank {rank} failed:\n{value}", rank)
    _check_collectives({r: got[r][1][1] for r in range(world_size)})
    return [_decode(got[r][1][0]) for r in range(world_size)]


def _check_exits(procs, deadline: float, timeout: float) -> None:
    """Every rank returned: each must also exit, with code 0 (a crash in teardown is a failure too)."""
    for rank, p in enumerate(procs):
        p.join(timeout=max(deadline - time.monotonic(), 0.1))
        if p.exitcode is None:
            raise TimeoutError(f"rank {rank} returned its result but did not exit within {timeout:.0f} s "
                               "(a hang in teardown: a collective still waiting for its peers?)")
        if p.exitcode != 0:
            raise RankFailure(f"rank {rank} returned its result but then exited with code {p.exitcode} "
                              "(a crash after fn returned: in teardown, an exit hook or a thread)", rank)


def _check_collectives(issued: dict[int, dict[str, int]]) -> None:
    """Every rank of a group issued as many collectives on it as the others (a collective on some ranks only
    is one its peers never matched: a real job hangs on it, or it pairs with the wrong call)."""
    by_group: dict[str, dict[int, int]] = {}
    for rank, groups in issued.items():
        for name, count in groups.items():
            by_group.setdefault(name, {})[rank] = count
    for name, counts in sorted(by_group.items()):
        if len(set(counts.values())) > 1:
            raise RankFailure(
                f"ranks issued different numbers of collectives on process group {name!r}: "
                + ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
                + "; a collective issued on some ranks only (an async one never waited on, or one behind a "
                "rank-dependent branch) is never matched: issue it on every rank of the group",
                min(counts, key=lambda r: counts[r]))


def _decode(payload: bytes):
    return torch.load(io.BytesIO(payload), weights_only=False)


def run_launch(args: list[str], timeout: float = 180.0, env: dict[str, str] | None = None,
               cwd: str | None = None, launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m fleetlite.cli launch *args`` with a timeout; kills the whole process group on expiry.

    ``launcher`` replaces the command standing for ``fleetlite launch`` (e.g.
    ``["fleetlite", "launch"]`` for the console script, or
    ``[sys.executable, "-m", "fleetlite.distributed.launch"]``).
    """
    timeout = timeout * timeout_scale()
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    prefix = list(launcher) if launcher else [sys.executable, "-m", "fleetlite.cli", "launch"]
    cmd = [*prefix, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                            cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise TimeoutError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s\n"
                           f"stdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
