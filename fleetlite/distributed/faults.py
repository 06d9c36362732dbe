"""Rank failures: which rank is lost when a collective fails (:class:`CollectiveError` and its diagnosis).

# Note [lost rank diagnosis]
gloo and NCCL report a dead peer as "connection closed/reset" (at once: the
kernel closes a dead process's sockets) or as a timeout (a hung peer), naming
an address, never a rank. To name it, every rank publishes its host and pid
in the process group's store when the group is created (keys prefixed by the
elastic restart count and a per-process generation, so a restarted group never
reads its predecessor's entries); a rank that fails with its own exception
records the error there before it exits (:func:`record_rank_error`). A rank
whose collective fails then sorts every peer out:

* raised: the peer recorded an exception (named in the message);
* died: the peer runs on this host and its process is gone or a zombie
  (SIGKILL, out-of-memory killer, segfault);
* survivor: the peer checked in as having seen the failure too;
* silent: none of these within a short grace period: hung, far behind, or
  on another host and gone.

Every store call runs in a helper thread with a deadline: the store may be
gone with its host (outside torchrun rank 0 serves it) or stopped, and the
diagnosis must never hang. Nothing here costs anything until a collective
fails, except one store exchange when the group is created.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as tdist

from .env import default_timeout

__all__ = ["CollectiveError", "is_peer_failure", "register_process", "record_rank_error",
           "diagnose_peers", "peer_lost_error", "peer_failures"]

#: Seconds a failed rank waits for its peers to check in before calling them silent.
GRACE_S = 2.0
_STORE_CALL_S = 1.0
_HINTS = ("connection closed", "connection reset", "closed by peer", "broken pipe", "timed out", "timeout",
          "socket", "remote process", "communicator was aborted", "watchdog", "peer")
_BACKEND_WORDS = ("gloo", "nccl", "c10d", "processgroup", "pair.cc", "unbound_buffer", "distbackenderror")

_peers: dict[int, tuple[str, int]] = {}  # rank -> (host, pid), filled by register_process
_monitor_error: CollectiveError | None = None  # set by the peer monitor when it aborted the group (monitor.py)
_prefix: str | None = None
_generation = 0


class CollectiveError(RuntimeError):
    """A collective failed on this rank because a peer died or did not join it in time.

    The message names the collective, this rank, the lost peer ranks and
    what happened to them (Note [lost rank diagnosis] in
    :mod:`fleetlite.distributed.faults`), the timeout in force and what to
    do; ``lost`` maps each lost rank to ``"died"``, ``"raised"``,
    ``"silent"`` or ``"unknown"``. The backend's own error is chained as
    ``__cause__``.

    Example::

        try:
            dist.all_reduce(t)
        except CollectiveError as e:
            print("lost ranks:", sorted(e.lost))
    """

    def __init__(self, message: str, lost: dict[int, str] | None = None):
        super().__init__(message)
        self.lost = lost


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a backend error saying a peer closed its connection or did not answer in time."""
    if isinstance(exc, CollectiveError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = f"{type(exc).__name__} {exc}".lower()
    return any(h in text for h in _HINTS) and any(w in text for w in _BACKEND_WORDS)


def _store():
    if not (tdist.is_available() and tdist.is_initialized()):
        return None
    try:
        store = tdist.distributed_c10d._get_default_store()  # torch has no public accessor
    except Exception:  # noqa: BLE001 - no store: diagnosis works from pids alone
        return None
    # our keys live in the raw store under our own prefix (restart count included), out of torch's namespaces
    # (Note [elastic store reuse] in collective.py)
    while getattr(store, "underlying_store", None) is not None:
        store = store.underlying_store
    return store


def _bounded(fn, seconds: float = _STORE_CALL_S) -> Any:
    """``fn()`` in a daemon thread; raises TimeoutError when it does not return within ``seconds``."""
    box: dict[str, Any] = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name="fleetlite-store")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError(f"the store did not answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def register_process(timeout: float = 60.0) -> None:
    """Publish this rank's host and pid and learn every peer's (collective; done by ``init_parallel_env``)."""
    global _prefix, _generation
    store = _store()
    if store is None:
        return
    _generation += 1
    _prefix = f"fleetlite/faults/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{_generation}/"
    rank, world = tdist.get_rank(), tdist.get_world_size()
    _peers.clear()
    try:
        store.set(f"{_prefix}proc/{rank}", f"{socket.gethostname()}|{os.getpid()}")
        keys = [f"{_prefix}proc/{r}" for r in range(world)]
        _bounded(lambda: store.wait(keys), timeout)
        for r, k in enumerate(keys):
            host, _, pid = store.get(k).decode().rpartition("|")
            _peers[r] = (host, int(pid))
    except Exception:  # noqa: BLE001 - only the quality of a later error message depends on this
        _peers.clear()


def record_rank_error(exc: BaseException) -> None:
    """Leave ``exc`` in the store so the peers can say why this rank is gone (bounded, never raises)."""
    store = _store()
    if store is None or _prefix is None or is_peer_failure(exc):
        return
    text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    try:
        _bounded(lambda: store.set(f"{_prefix}error/{tdist.get_rank()}", text), 0.5)
    except Exception:  # noqa: BLE001 - the original exception matters more
        pass


def _process_state(pid: int) -> str:
    """'alive', 'gone' (no such process or a zombie) for a process on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "alive"
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        return "gone" if state in ("Z", "X") else "alive"
    except (OSError, IndexError):
        return "alive"


def diagnose_peers(grace: float = GRACE_S) -> tuple[dict[int, tuple[str, str]], str | None]:
    """What happened to each peer after a failed collective (Note [lost rank diagnosis]).

    Returns ``({rank: (kind, text)}, store_problem)`` with kind ``"raised"``,
    ``"died"``, ``"survivor"`` or ``"silent"`` and text a phrase for messages.
    """
    me, world = tdist.get_rank(), tdist.get_world_size()
    store, host = _store(), socket.gethostname()
    store_problem = None
    served_by_rank0 = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
    if served_by_rank0 and me != 0 and _peers.get(0, ("?",))[0] == host and _process_state(_peers[0][1]) == "gone":
        store_problem = "it was served by rank 0, whose process is gone"
    if store is not None and _prefix is not None and store_problem is None:
        try:
            _bounded(lambda: store.set(f"{_prefix}failed/{me}", "1"))
        except Exception as e:  # noqa: BLE001
            store_problem = f"{type(e).__name__}: {e}"
    status: dict[int, tuple[str, str]] = {}
    deadline = time.monotonic() + grace
    while True:
        pending = []
        for r in range(world):
            if r == me or status.get(r, ("",))[0] in ("raised", "survivor"):
                continue
            peer_host, pid = _peers.get(r, ("?", -1))
            where = f"pid {pid} on {peer_host}" if pid > 0 else "process unknown"
            if store is not None and _prefix is not None and store_problem is None:
                try:
                    err_key, fail_key = f"{_prefix}error/{r}", f"{_prefix}failed/{r}"
                    if _bounded(lambda k=err_key: store.check([k])):
                        error = _bounded(lambda k=err_key: store.get(k)).decode()
                        status[r] = ("raised", f"raised {error} ({where})")
                        continue
                    if _bounded(lambda k=fail_key: store.check([k])):
                        status[r] = ("survivor", f"saw the failure too ({where})")
                        continue
                except Exception as e:  # noqa: BLE001
                    store_problem = f"{type(e).__name__}: {e}"
            if pid > 0 and peer_host == host and _process_state(pid) == "gone":
                status[r] = ("died", f"died: its process ({where}) is gone (killed, e.g. by SIGKILL or the "
                                     "out-of-memory killer, or crashed)")
                continue
            if pid > 0 and peer_host == host:
                status[r] = ("silent", f"is alive ({where}) but did not answer: hung, or far behind")
            else:
                status[r] = ("silent", f"did not answer ({where}): dead, hung or unreachable")
            pending.append(r)
        if not pending or time.monotonic() >= deadline:
            return status, store_problem
        time.sleep(0.05)


def peer_lost_error(where: str, exc: BaseException, timeout_s: float | None = None) -> CollectiveError:
    """A :class:`CollectiveError` for ``exc`` raised in ``where``, naming the lost ranks (``.lost``)."""
    if _monitor_error is not None:  # the monitor aborted the group: same message (Note [peer monitor], monitor.py)
        return CollectiveError(str(_monitor_error), dict(_monitor_error.lost or {}))
    me, world = tdist.get_rank(), tdist.get_world_size()
    status, store_problem = diagnose_peers()
    lost = {r: kind for r, (kind, _) in status.items() if kind != "survivor"}
    texts = [f"rank {r} {text}" for r, (kind, text) in sorted(status.items()) if kind != "survivor"]
    if not lost and store_problem is not None:
        lost = {0: "unknown"}
        texts = [f"the store is unreachable ({store_problem}); outside torchrun rank 0 serves it, so rank 0 is "
                 "most likely gone"]
    head = "; ".join(texts) if texts else "no peer was found lost (every rank is alive and saw the failure)"
    limit = f" ({timeout_s:g} s)" if timeout_s else ""
    backend = " ".join(str(exc).split())[:400]
    msg = (f"{where} failed on rank {me} of {world}: {head}. Every rank must take part in each collective within "
           f"the collective timeout{limit}, set by init_parallel_env(timeout=...) or FLEETLITE_COLLECTIVE_TIMEOUT; "
           "the job cannot go on without the lost rank. Fix its cause (see its output), then restart; "
           "`fleetlite launch --max_restarts N ... resume=auto` restarts by itself from the newest checkpoint. "
           f"Backend error: {backend}")
    return CollectiveError(msg, lost)


@contextlib.contextmanager
def peer_failures(where: str) -> Iterator[None]:
    """Turn a peer failure inside the block into a ``CollectiveError`` naming the lost ranks; record own errors.

    A no-op without a process group. Example::

        with peer_failures("the training step"):
            loss.backward()
    """
    try:
        yield
    except Exception as e:
        if _store() is None or getattr(e, "lost", None) is not None:
            raise
        if is_peer_failure(e):
            raise peer_lost_error(where, e, default_timeout().total_seconds()) from e
        record_rank_error(e)
        raise
