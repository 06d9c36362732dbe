"""A rendezvous that fails, in one line: what happened at which endpoint, and what to check.

``fleetlite launch`` reports three failures before any worker starts: a node
that does not join in time (torchrun's static rendezvous: ``DistStoreError``
"waiting for clients"; c10d: ``RendezvousTimeoutError``), a master that
cannot be reached, and a port already in use. A node that is not the master
first checks, with a plain socket, that the master's endpoint answers
(:func:`reach_master`): torch's own store client would print its C++ retry
log and frame dump on every attempt.
"""

from __future__ import annotations

import socket
import time
from typing import Any

__all__ = ["rendezvous_failure", "reach_master", "STATIC_TIMEOUT_S", "C10D_READ_TIMEOUT_S"]

#: torchrun's static rendezvous waits this long for the other nodes unless ``--rdzv_conf timeout=`` says otherwise.
STATIC_TIMEOUT_S = 600.0
#: torchrun's c10d rendezvous waits this long to reach its store unless ``--rdzv_conf read_timeout=`` says otherwise.
C10D_READ_TIMEOUT_S = 60.0


def _endpoint(args: Any) -> tuple[str, int | None]:
    raw = args.rdzv_endpoint or f"{args.master_addr}:{args.master_port}"
    host, _, port = raw.rpartition(":")
    return (host or raw), (int(port) if port.isdigit() else None)


def _conf(args: Any, key: str, default: float) -> float:
    for item in (args.rdzv_conf or "").split(","):
        name, _, value = item.partition("=")
        if name.strip() == key:
            try:
                return float(value)
            except ValueError:
                return default
    return default


def _is_local(host: str) -> bool:
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return False
    if addr.startswith("127."):
        return True
    try:
        with socket.socket() as s:
            s.bind((addr, 0))  # only an address of this machine can be bound
        return True
    except OSError:
        return False


def reach_master(args: Any, poll_s: float = 1.0) -> str | None:
    """None when this node is the master or the master's endpoint answers; else the one-line reason.

    A non-master node waits for the master as long as torchrun would (static: ``timeout``, c10d:
    ``read_timeout`` of ``--rdzv_conf``): the master's launcher may start a little later.
    """
    if args.standalone or args.rdzv_backend not in ("static", "c10d"):
        return None
    host, port = _endpoint(args)
    if port is None:
        return None
    if args.rdzv_backend == "static":
        if int(args.node_rank or 0) == 0:
            return None
        wait = _conf(args, "timeout", STATIC_TIMEOUT_S)
    else:
        if _is_local(host):
            return None  # this node may host the c10d store itself
        wait = _conf(args, "read_timeout", C10D_READ_TIMEOUT_S)
    try:
        socket.getaddrinfo(host, port)
    except OSError as e:
        return (f"cannot reach the master at {host}:{port}: the name {host!r} does not resolve from this node "
                f"({e.strerror or e}); check the master address (--master_addr / --rdzv_endpoint / --ips)")
    deadline = time.monotonic() + wait
    last: OSError | None = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(poll_s * 5, max(wait, 0.1))):
                return None
        except OSError as e:
            last = e
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    why = getattr(last, "strerror", None) or last
    return (f"cannot reach the master at {host}:{port} within {wait:g} s ({why}): check that the master node's "
            f"launcher is running (node rank 0), that {host} is its address as seen from this node, and that port "
            f"{port} is open (firewall)")


def rendezvous_failure(e: BaseException, args: Any) -> str:
    """One line for a rendezvous that failed: what happened at which endpoint, and what to check.

    >>> class A: rdzv_endpoint, master_addr, master_port, rdzv_backend, nnodes = "", "n0", 29500, "static", "2"
    >>> rendezvous_failure(RuntimeError("Timed out after 901 seconds waiting for clients. 1/2 clients joined."), A)[:60]
    'the nodes did not all join the rendezvous at n0:29500 in tim'
    """
    host, port = _endpoint(args)
    endpoint = f"{host}:{port}"
    text = " ".join(str(e).split())
    cause = " ".join(str(e.__cause__ or e.__context__ or "").split())
    both = f"{text} {cause}".lower()
    kind = type(e).__name__
    setting = "--rdzv_conf join_timeout=SECONDS" if args.rdzv_backend == "c10d" else "--rdzv_conf timeout=SECONDS"
    if "eaddrinuse" in both or "address already in use" in both:
        return (f"port {port} at {endpoint} is in use (another job or an earlier run holds it): choose a free port "
                "for --master_port / --rdzv_endpoint, or stop the other process")
    if kind == "RendezvousTimeoutError" or "waiting for clients" in both:
        return (f"the nodes did not all join the rendezvous at {endpoint} in time (--nnodes {args.nnodes}; {kind}): "
                "check that `fleetlite launch` runs on every node with the same --nnodes and --rdzv_id and that each "
                f"reaches {endpoint}; wait longer with {setting}")
    if kind == "RendezvousConnectionError" or "connect" in both or "timed out" in both:
        return (f"cannot reach the rendezvous at {endpoint} ({kind}): check that the master node's launcher is "
                f"running, that {host} resolves from this node and that the port is open (firewall)")
    if kind == "RendezvousClosedError":
        return (f"the rendezvous at {endpoint} was closed (the job ended or another node gave up): start the job "
                "again with a new --rdzv_id")
    return f"the rendezvous at {endpoint} failed ({kind}: {text[:200]}): check every node's options"
