"""``spawn``: start N worker processes of one function, Paddle style."""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Iterator

import torch
import torch.multiprocessing as mp

from .collective import _resolve_backend
from .env import read_env, trainer_endpoint

__all__ = ["spawn", "SpawnError", "find_free_port"]


class SpawnError(RuntimeError):
    """A spawned worker failed; ``rank`` names it and the message carries its traceback.

    Example::

        try:
            dist.spawn(train, nprocs=2)
        except SpawnError as e:
            print("rank", e.rank, "failed:", e)
    """

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


# Note [master port]
# The port is picked here and bound later by rank 0's TCPStore, so in between another socket may take it. The
# kernel hands out its *ephemeral* ports (net.ipv4.ip_local_port_range, 32768-60999 by default) to every outgoing
# connection, and a training's gloo ranks open many: a port the kernel just gave us for ``bind(0)`` is soon handed
# to a client socket, and rank 0 then fails with EADDRINUSE. So the master port is drawn at random from the
# 12,000 ports below that range, which the kernel never assigns by itself, and checked free; two launches picking
# at the same time (parallel test workers) meet with odds of 1 in 12,000. Without such a range it is bind(0).
def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now, below the kernel's ephemeral range (Note [master port])."""
    import random

    low = _ephemeral_low()
    if low - 12000 >= 1024:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(low - 12000, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker_env(rank: int, world_size: int, master_addr: str, master_port: int,
               local_rank: int | None = None, local_world_size: int | None = None) -> dict[str, str]:
    """The variables a worker needs, in both torchrun's and Paddle's conventions."""
    local_rank = rank if local_rank is None else local_rank
    local_world_size = world_size if local_world_size is None else local_world_size
    endpoints = [trainer_endpoint(master_addr, master_port, i) for i in range(world_size)]
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "PADDLE_TRAINER_ID": str(rank),
        "PADDLE_TRAINERS_NUM": str(world_size),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
        "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
    }


#: Variables of an enclosing launcher (torchrun / Paddle) that must not leak into spawned children: with them a
#: child would look for torchelastic's agent store on the new group's port and hang until the timeout.
_LAUNCHER_PREFIXES = ("TORCHELASTIC_", "PADDLE_", "GROUP_", "ROLE_")
_LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                   "FLAGS_selected_gpus")


def _is_launcher_var(name: str) -> bool:
    return name in _LAUNCHER_NAMES or name.startswith(_LAUNCHER_PREFIXES)


@contextlib.contextmanager
def _child_environment(extra: dict[str, str]) -> Iterator[None]:
    """The parent's environment while the children start: without launcher variables, with ``extra``.

    Set before the children exist, so a child sees it from its first line (``CUDA_VISIBLE_DEVICES`` must be
    in place before the main module, and torch, are imported there); restored afterwards.
    """
    saved = {k: v for k, v in os.environ.items() if _is_launcher_var(k) or k in extra}
    for k in saved:
        if _is_launcher_var(k):
            del os.environ[k]
    os.environ.update(extra)
    try:
        yield
    finally:
        for k in extra:
            os.environ.pop(k, None)
        os.environ.update(saved)


def _refuse_inside_a_job() -> None:
    try:
        env = read_env()
    except ValueError:  # malformed launcher variables: the children do not inherit them anyway
        return
    if env.world_size > 1:
        raise SpawnError(f"spawn() was called in rank {env.rank} of a job of {env.world_size} processes (started by "
                         "`fleetlite launch` or another launcher): each rank would start its own group. The "
                         "launcher already started the processes: call the function directly there, or run the "
                         "script with plain python to let spawn start them")


def _entry(index: int, func, args, envs: list[dict[str, str]]) -> None:
    os.environ.update(envs[index])
    func(*args)


def _default_nprocs() -> int:
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return os.cpu_count() or 1


_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_KNOWN_OPTIONS = ("start_method", "master_addr", "master_port", "backend", "ips", "gpus", "print_config")
_DEPRECATED_OPTIONS = ("selected_devices", "started_port", "cluster_node_ips", "node_ip", "use_paddlecloud")
_REFUSED_OPTIONS = {"xpus": "Kunlun XPUs", "mlus": "Cambricon MLUs"}


class UnknownSpawnOption(ValueError, TypeError):
    """An option ``spawn`` does not know: Paddle's ``ValueError`` (a ``TypeError`` too, as fleetlite raised
    before, like an unexpected keyword argument)."""


def _check_options(options: dict) -> None:
    """Paddle's option check: unknown options are a ValueError, its deprecated ones a DeprecationWarning (and
    ignored, as in Paddle); the device options of other accelerators are refused."""
    for key in options:
        if key in _DEPRECATED_OPTIONS:
            warnings.warn(f"The config option ({key}) of `spawn` is deprecated (and ignored, as in Paddle); use "
                          f"the options in the spawn documentation: {', '.join(_KNOWN_OPTIONS)}",
                          DeprecationWarning, stacklevel=3)
        elif key in _REFUSED_OPTIONS:
            raise NotImplementedError(f"spawn({key}=...): {_REFUSED_OPTIONS[key]} are not supported by fleetlite "
                                      "(PyTorch on CUDA or CPU); use gpus=... or drop the option")
        elif key not in _KNOWN_OPTIONS:
            raise UnknownSpawnOption(f"The config option ({key}) of `spawn` is not supported: spawn got unknown "
                                     f"options {sorted(k for k in options if k not in _KNOWN_OPTIONS)}; known: "
                                     f"{', '.join(_KNOWN_OPTIONS)}")


def _paddle_options(options: dict, nprocs: int) -> tuple[int, dict[str, str]]:
    """Apply Paddle's ``backend``/``gpus``/``ips`` spawn options: the process count and extra variables."""
    extra: dict[str, str] = {}
    backend = options.get("backend")
    if backend is not None:
        _resolve_backend(backend)  # unknown backend / NCCL without CUDA: fail before any process starts
        extra["PADDLE_DISTRI_BACKEND"] = backend.lower()
    ips = options.get("ips")
    if ips is not None and any(ip.strip() not in _LOCAL_HOSTS for ip in str(ips).split(",") if ip.strip()):
        raise ValueError(f"spawn(ips={ips!r}): spawn starts processes on this machine only; to run on several "
                         "machines start the script on each with `fleetlite launch --nnodes N --rdzv_backend c10d "
                         "--rdzv_endpoint HOST:PORT script.py`")
    gpus = options.get("gpus")
    if gpus is not None:
        ids = [g.strip() for g in str(gpus).split(",") if g.strip()]
        if not ids or not all(g.isdigit() for g in ids):
            raise ValueError(f"spawn(gpus={gpus!r}) must be a comma-separated list of GPU indices, e.g. '0,1'")
        if nprocs == -1:
            nprocs = len(ids)
        if nprocs > len(ids):
            raise ValueError(f"spawn(nprocs={nprocs}, gpus={gpus!r}): more processes than selected GPUs; "
                             "list one GPU per process or lower nprocs")
        extra["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    return nprocs, extra


def spawn(func, args=(), nprocs: int = -1, join: bool = True, daemon: bool = False, **options):
    """Run ``func(*args)`` in ``nprocs`` new processes with the distributed environment set.

    Each process gets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/
    ``MASTER_PORT`` (a free port is picked) and Paddle's ``PADDLE_*`` variables,
    so ``func`` only needs to call ``init_parallel_env()``.

    Args:
        func: a module-level (picklable) function.
        args: positional arguments for ``func``.
        nprocs: number of processes; -1 means one per visible GPU (or per entry
            of ``gpus``), else one per CPU core.
        join: wait for all processes; with ``False`` the process context is returned.
        options: ``start_method`` (default ``"spawn"``), ``master_addr``, ``master_port``,
            and Paddle's ``backend`` (what ``init_parallel_env()`` uses in the
            children, via ``PADDLE_DISTRI_BACKEND``), ``gpus`` (e.g. ``"0,1"``: sets
            ``CUDA_VISIBLE_DEVICES`` before the children start), ``ips`` (this machine only) and
            ``print_config`` (print each process's environment). As in Paddle, an unknown option is a
            ValueError and Paddle's deprecated ones (``selected_devices``, ``started_port``, ...) a
            DeprecationWarning; ``xpus``/``mlus`` are refused (NotImplementedError).
            The children do not inherit an enclosing launcher's variables.

    Raises:
        SpawnError: at once when called inside one rank of a multi-process job (the launcher already
            started the processes); when a worker raises or dies, naming its rank, with the
            worker's traceback; the other workers are stopped first.

    Example::

        def train():
            dist.init_parallel_env()
            ...

        if __name__ == "__main__":
            dist.spawn(train, nprocs=2)
    """
    if not callable(func):
        raise TypeError(f"spawn needs a callable, got {type(func).__name__}")
    _check_options(options)
    if not isinstance(nprocs, int) or (nprocs < 1 and nprocs != -1):
        raise ValueError(f"nprocs={nprocs!r} must be a positive integer or -1 (one per GPU / CPU core)")
    _refuse_inside_a_job()
    nprocs, extra = _paddle_options(options, nprocs)
    if nprocs == -1:
        nprocs = _default_nprocs()
    start_method = options.get("start_method", "spawn")
    addr = options.get("master_addr", "127.0.0.1")
    port = int(options.get("master_port") or find_free_port(addr))
    envs = [worker_env(r, nprocs, addr, port) for r in range(nprocs)]
    if options.get("print_config"):  # Paddle's debug option: the environment of each process
        for r, env in enumerate(envs):
            print(f"spawn: process {r}: {', '.join(f'{k}={v}' for k, v in sorted({**env, **extra}.items()))}")
    if "CUDA_VISIBLE_DEVICES" in extra:
        for r, env in enumerate(envs):
            env["FLAGS_selected_gpus"] = str(r)
    try:
        with _child_environment(extra):
            ctx = mp.start_processes(_entry, args=(func, tuple(args), envs), nprocs=nprocs, join=False,
                                     daemon=daemon, start_method=start_method)
    except Exception as e:
        hint = ("; define the function at module level (not a lambda or a nested function) so the new "
                "processes can import it") if "pickle" in str(e).lower() else ""
        raise SpawnError(f"could not start {nprocs} processes: {type(e).__name__}: {e}{hint}") from e
    if not join:
        return ctx
    try:
        while not ctx.join():
            pass
    except mp.ProcessRaisedException as e:
        raise SpawnError(f"rank {e.error_index} of {nprocs} raised an exception (the other ranks were "
                         f"stopped):\n{str(e).strip()}", rank=e.error_index) from None
    except mp.ProcessExitedException as e:
        raise SpawnError(f"rank {e.error_index} of {nprocs} exited with code {e.exit_code}"
                         f"{' (signal ' + e.signal_name + ')' if e.signal_name else ''}; "
                         "the other ranks were stopped", rank=e.error_index) from None
    return ctx
