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
import queue
import signal
import subprocess
import sys
import time
import traceback

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


_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        _CTX = _mp.get_context("forkserver")
        # the fork server imports torch once; every rank is then a cheap fork of a torch-ready process
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "fleetlite.distributed"])
    return _CTX


def _rank_main(rank, world_size, port, fn, args, kwargs, results, env, init):
    os.environ.update(env)
    os.environ.update(worker_env(rank, world_size, "127.0.0.1", port))
    torch.set_num_threads(1)
    try:
        if init:
            dist.init_parallel_env(backend="gloo")
        out = fn(rank, world_size, *args, **kwargs)
        # serialise here: tensors sent through the queue as shared memory die with this process
        buf = io.BytesIO()
        torch.save(out, buf)
        results.put((rank, "ok", buf.getvalue()))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def run_ranks(fn, world_size: int = 2, args=(), kwargs=None, timeout: float = 120.0,
              env: dict[str, str] | None = None, init: bool = True, expect_failure: bool = False):
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` processes.

    ``fn`` must be importable (module level). The process group (gloo) is
    initialised before ``fn`` runs unless ``init=False``. Returns the list of
    return values by rank. With ``expect_failure=True`` returns a dict
    ``{rank: ("ok", value) | ("error", text)}`` instead of raising, for tests
    that check how ranks fail.
    """
    timeout = timeout * timeout_scale()
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world_size, port, fn, tuple(args), dict(kwargs or {}),
                                              results, dict(env or {}), init), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
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
    finally:
        for p in procs:
            p.join(timeout=5 if len(got) == world_size else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    if expect_failure:
        return {r: (s, _decode(v) if s == "ok" else v) for r, (s, v) in got.items()}
    for rank in sorted(got):
        status, value = got[rank]
        if status == "error":
            raise RankFailure(f"rank {rank} failed:\n{value}", rank)
    return [_decode(got[r][1]) for r in range(world_size)]


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
