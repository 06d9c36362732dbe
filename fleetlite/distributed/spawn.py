"""``spawn``: start N worker processes of one function, Paddle style."""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp

__all__ = ["spawn", "SpawnError", "find_free_port"]


class SpawnError(RuntimeError):
    """A spawned worker failed; ``rank`` names it and the message carries its traceback."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker_env(rank: int, world_size: int, master_addr: str, master_port: int,
               local_rank: int | None = None, local_world_size: int | None = None) -> dict[str, str]:
    """The variables a worker needs, in both torchrun's and Paddle's conventions."""
    local_rank = rank if local_rank is None else local_rank
    local_world_size = world_size if local_world_size is None else local_world_size
    endpoints = ",".join(f"{master_addr}:{master_port + 1 + i}" for i in range(world_size))
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "PADDLE_TRAINER_ID": str(rank),
        "PADDLE_TRAINERS_NUM": str(world_size),
        "PADDLE_TRAINER_ENDPOINTS": endpoints,
        "PADDLE_CURRENT_ENDPOINT": f"{master_addr}:{master_port + 1 + rank}",
    }


def _entry(index: int, func, args, envs: list[dict[str, str]]) -> None:
    os.environ.update(envs[index])
    func(*args)


def _default_nprocs() -> int:
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return os.cpu_count() or 1


def spawn(func, args=(), nprocs: int = -1, join: bool = True, daemon: bool = False, **options):
    """Run ``func(*args)`` in ``nprocs`` new processes with the distributed environment set.

    Each process gets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/
    ``MASTER_PORT`` (a free port is picked) and Paddle's ``PADDLE_*`` variables,
    so ``func`` only needs to call ``init_parallel_env()``.

    Args:
        func: a module-level (picklable) function.
        args: positional arguments for ``func``.
        nprocs: number of processes; -1 means one per visible GPU, else one per CPU core.
        join: wait for all processes; with ``False`` the process context is returned.
        options: ``start_method`` (default ``"spawn"``), ``master_addr``, ``master_port``.

    Raises:
        SpawnError: when a worker raises or dies, naming its rank, with the
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
    if nprocs == -1:
        nprocs = _default_nprocs()
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r} must be a positive integer or -1 (one per GPU / CPU core)")
    unknown = set(options) - {"start_method", "master_addr", "master_port", "backend", "ips", "gpus"}
    if unknown:
        raise TypeError(f"spawn got unknown options {sorted(unknown)}; "
                        "known: start_method, master_addr, master_port")
    start_method = options.get("start_method", "spawn")
    addr = options.get("master_addr", "127.0.0.1")
    port = int(options.get("master_port") or find_free_port(addr))
    envs = [worker_env(r, nprocs, addr, port) for r in range(nprocs)]
    try:
        ctx = mp.start_processes(_entry, args=(func, tuple(args), envs), nprocs=nprocs, join=False,
                                 daemon=daemon, start_method=start_method)
    except Exception as e:  # pragma: no cover - start failures are platform issues
        raise SpawnError(f"could not start {nprocs} processes: {e}") from e
    if not join:
        return ctx
    try:
        while not ctx.join():
            pass
    except mp.ProcessRaisedException as e:
        raise SpawnError(f"rank {e.error_index} of {nprocs} raised an exception (the other ranks were "
                         f"stopped):\n{e}", rank=e.error_index) from None
    except mp.ProcessExitedException as e:
        raise SpawnError(f"rank {e.error_index} of {nprocs} exited with code {e.exit_code}"
                         f"{' (signal ' + e.signal_name + ')' if e.signal_name else ''}; "
                         "the other ranks were stopped", rank=e.error_index) from None
    return ctx
