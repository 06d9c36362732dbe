"""Worker bootstrap used by ``fleetlite launch``: export Paddle's variables, then run the script.

torchrun starts ``python _bootstrap.py --script SCRIPT ARGS...`` (or ``--module MOD``);
this sets ``PADDLE_TRAINER_ID`` & co. from torchrun's variables and runs the
target as ``__main__`` exactly as ``python SCRIPT ARGS...`` would. An
exception in the script is recorded in torchelastic's error file, so the
launcher's failure summary shows the worker's traceback.
"""

from __future__ import annotations

import datetime
import os
import runpy
import socket
import sys
from collections.abc import MutableMapping

#: Seconds the workers of a multi-node job wait for each other's endpoints before going on without them.
ENDPOINT_EXCHANGE_TIMEOUT_S = 120.0


def _endpoint_host(master_addr: str, master_port: int) -> str:
    """The address of this machine on the route to the master (what the other nodes can reach)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master_addr, master_port))  # UDP: no packet is sent, only a route is chosen
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


def _exchange_endpoints(env: MutableMapping[str, str], rank: int, world: int, mine: str) -> list[str] | None:
    """Every rank's endpoint, gathered through torchelastic's agent store (multi-node jobs).

    Returns ``None`` when the store cannot be used; the endpoints are
    informational, so the job goes on without them rather than failing here.
    """
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None  # the store is created by the workers themselves: nothing to talk to yet
    import torch.distributed as tdist  # only with the agent's store: a plain run leaves torch to the user's script

    timeout = datetime.timedelta(seconds=ENDPOINT_EXCHANGE_TIMEOUT_S)
    try:
        store = tdist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timeout)
        prefix = f"fleetlite/endpoints/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        store.set(f"{prefix}{rank}", mine)
        keys = [f"{prefix}{r}" for r in range(world)]
        store.wait(keys, timeout)
        return [store.get(k).decode() for k in keys]
    except Exception as e:  # noqa: BLE001 - informational variables must not kill the job
        print(f"fleetlite launch: could not exchange PADDLE_TRAINER_ENDPOINTS between nodes ({e}); "
              "the variable is left unset", file=sys.stderr)
        return None


def export_paddle_env(env: MutableMapping[str, str] | None = None) -> None:
    """Mirror torchrun's rank variables into Paddle's launch variables.

    The launcher is authoritative: values left over in the user's shell are
    overwritten. Endpoints are ``HOST:MASTER_PORT+1+RANK`` (the ports are
    informational, as in Paddle's listing); on several nodes they are gathered
    from every node through torchelastic's store.
    """
    env = os.environ if env is None else env
    rank = int(env.get("RANK", "0"))
    world = int(env.get("WORLD_SIZE", "1"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    addr = env.get("MASTER_ADDR", "127.0.0.1")
    port = int(env.get("MASTER_PORT", "6170"))
    env["PADDLE_TRAINER_ID"] = str(rank)
    env["PADDLE_TRAINERS_NUM"] = str(world)
    # the same formula as env.trainer_endpoint; this script runs before the package is imported, so it
    # keeps its own copy rather than pull torch in ahead of the user's script
    if local_world == world:  # one node: every endpoint is known
        eps = [f"{addr}:{port + 1 + i}" for i in range(world)]
    else:
        eps = _exchange_endpoints(env, rank, world, f"{_endpoint_host(addr, port)}:{port + 1 + rank}")
    if eps:
        env["PADDLE_TRAINER_ENDPOINTS"] = ",".join(eps)
        env["PADDLE_CURRENT_ENDPOINT"] = eps[rank]
    else:
        env.pop("PADDLE_TRAINER_ENDPOINTS", None)
        env.pop("PADDLE_CURRENT_ENDPOINT", None)
    if "CUDA_VISIBLE_DEVICES" in env or local_world > 1:
        env["FLAGS_selected_gpus"] = str(local_rank)


def _record(e: BaseException) -> bool:
    """Write ``e`` to torchelastic's error file so the launcher's summary shows the traceback; True when written."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler  # only on a failure

        handler = get_error_handler()
        handler.initialize()
        handler.record_exception(e)
        return os.path.isfile(path)
    except Exception:  # noqa: BLE001 - the original exception matters more
        return False


def _tell_peers(e: BaseException) -> None:
    """Leave the error where the other ranks look when their collectives fail (Note [lost rank diagnosis]).

    This file runs as a plain script (no package, so no relative import): the
    store records live in the ``fleetlite.distributed.faults`` module the
    user's script loaded when it made its process group. Not loaded: the
    script made no fleetlite group, and there is nothing to tell.
    """
    faults = sys.modules.get("fleetlite.distributed.faults")
    if faults is None:
        return
    try:
        faults.record_rank_error(e)
    except Exception:  # noqa: BLE001 - the original exception matters more
        pass


def _quiet() -> bool:
    """Whether a quiet ``fleetlite launch`` reports this worker's error (one line; the traceback in its log).

    The launcher's default, marked by the log it names (``FLEETLITE_LAUNCH_LOG``); ``FLEETLITE_VERBOSE=1``
    or ``LOGLEVEL`` keep Python's traceback on this worker's stderr (the same test as ``launch.verbose``,
    repeated because this script must not import the package before the user's script does).
    """
    loud = os.environ.get("FLEETLITE_VERBOSE", "").strip().lower() in ("1", "true", "yes") \
        or "LOGLEVEL" in os.environ
    return bool(os.environ.get("FLEETLITE_LAUNCH_LOG")) and not loud


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("--script", "--module"):
        raise SystemExit("usage: _bootstrap.py --script SCRIPT [ARGS] | --module MODULE [ARGS]")
    mode, target, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    export_paddle_env()
    sys.argv = [target, *rest]
    try:
        if mode == "--module":
            sys.path[0] = os.getcwd()  # as `python -m`: modules are found from the working directory
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    except Exception as e:
        recorded = _record(e)
        _tell_peers(e)
        if recorded and _quiet():  # the launcher prints it in one line and keeps the traceback in its log
            raise SystemExit(1) from None
        raise
    except KeyboardInterrupt:
        if not _quiet():
            raise
        print(f"rank {os.environ.get('RANK', '?')}: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
