"""The peer monitor: NCCL survivors learn at once that a peer raised or died (gloo's sockets already tell them).

Note [peer monitor]
gloo turns a dead or raising peer into an exception at once (its sockets close). NCCL does not: the host
thread waits for a kernel that never finishes, until the watchdog kills the process after the collective
timeout. So with NCCL a daemon thread watches the store records that ``faults`` already keeps: every
``MONITOR_INTERVAL_S`` it asks (bounded) whether a peer recorded an error, and whether a peer on this host
is gone. When one did, it builds the same CollectiveError a failed gloo collective gets, keeps it, and
aborts the process group: the blocked collective then fails, and ``_collective`` / ``peer_failures`` raise
the kept error. A rank that shuts its group down cleanly first writes ``done/<rank>``, so a peer that
finished earlier is not taken for a dead one. Cost: a few small store round trips per interval in a
thread that holds the GIL only to issue them; nothing on the training thread. Lives beside
:mod:`fleetlite.distributed.faults` (whose records and messages it uses); faults does not import it.
"""

from __future__ import annotations

import os
import socket
import threading

import torch.distributed as tdist

from . import faults
from .faults import CollectiveError

__all__ = ["PeerMonitor", "start_monitor", "stop_monitor", "MONITOR_INTERVAL_S"]

MONITOR_INTERVAL_S = 0.5
_monitor: PeerMonitor | None = None


class PeerMonitor(threading.Thread):
    """Watches the peers of this rank's process group and aborts it when one is lost (Note [peer monitor]).

    Started by ``init_parallel_env`` for groups with NCCL (``FLEETLITE_PEER_MONITOR=1`` starts it for any
    group, ``0`` never). ``error`` is the CollectiveError it raised the alarm with.

    Example::

        monitor = PeerMonitor(interval=0.5)
        monitor.start()
        ...
        monitor.stop()
    """

    def __init__(self, interval: float = MONITOR_INTERVAL_S, abort=None, timeout_s: float | None = None) -> None:
        super().__init__(daemon=True, name="fleetlite-peer-monitor")
        self.interval = interval
        self.abort = abort if abort is not None else _abort_group
        self.timeout_s = timeout_s
        self.error: CollectiveError | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                lost = self.lost_peers()
            except Exception:  # noqa: BLE001 - a monitor must never be the thing that fails
                continue
            if lost and not self._halt.is_set():
                names = ", ".join(f"rank {r} {kind}" for r, kind in sorted(lost.items()))
                self.error = faults.peer_lost_error("a collective", RuntimeError(f"the peer monitor saw {names}"),
                                             self.timeout_s)
                faults._monitor_error = self.error
                try:
                    self.abort()
                except Exception:  # noqa: BLE001 - the kept error still names the peer
                    pass
                return

    def lost_peers(self) -> dict[int, str]:
        """``{rank: "raised" | "died"}`` for peers that recorded an error or whose process on this host is gone."""
        store, prefix = faults._store(), faults._prefix
        if store is None or prefix is None:
            return {}
        me, host = tdist.get_rank(), socket.gethostname()
        lost: dict[int, str] = {}
        for r, (peer_host, pid) in faults._peers.items():
            if r == me:
                continue
            if faults._bounded(lambda r=r: store.check([f"{prefix}done/{r}"])):
                continue
            if faults._bounded(lambda r=r: store.check([f"{prefix}error/{r}"])):
                lost[r] = "raised"
            elif peer_host == host and pid > 0 and faults._process_state(pid) == "gone":
                lost[r] = "died"
        return lost


def _abort_group() -> None:
    if tdist.is_initialized():
        tdist.group.WORLD.abort()


def start_monitor(nccl: bool, timeout_s: float | None = None) -> PeerMonitor | None:
    """Start the peer monitor for the current group when it uses NCCL (or ``FLEETLITE_PEER_MONITOR=1``)."""
    global _monitor
    stop_monitor(clean=False)
    faults._monitor_error = None
    forced = os.environ.get("FLEETLITE_PEER_MONITOR", "").strip()
    if forced == "0" or not (nccl or forced == "1") or faults._store() is None:
        return None
    _monitor = PeerMonitor(timeout_s=timeout_s)
    _monitor.start()
    return _monitor


def stop_monitor(clean: bool = True) -> None:
    """Stop the monitor; ``clean``: tell the peers this rank is done (a clean shutdown, not a loss)."""
    global _monitor
    if _monitor is not None:
        _monitor.stop()
        _monitor = None
    store, prefix = faults._store(), faults._prefix
    if clean and store is not None and prefix is not None:
        try:
            faults._bounded(lambda: store.set(f"{prefix}done/{tdist.get_rank()}", "1"), 0.5)
        except Exception:  # noqa: BLE001 - shutting down anyway
            pass
