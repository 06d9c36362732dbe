"""Process-group setup, the few collectives users call directly, and ``ParallelEnv``.

``init_parallel_env`` is the one place that turns the launcher's variables
(see :mod:`fleetlite.distributed.env`) into a ``torch.distributed`` process
group. Everything else in fleetlite asks this module for rank and world size.
Imports go one way inside ``fleetlite.distributed``: ``env`` <- ``faults`` <-
``monitor`` <- ``collective`` <- ``agreement`` / ``spawn`` (an import-linter
contract in pyproject.toml keeps it so).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as tdist
from torch.distributed import ProcessGroup

from . import faults
from .env import DEFAULT_TIMEOUT_S, DistEnvError, choose_backend, default_timeout, read_env
from .faults import CollectiveError, register_process
from .monitor import start_monitor, stop_monitor

__all__ = [
    "init_parallel_env",
    "get_rank",
    "get_world_size",
    "barrier",
    "is_initialized",
    "default_timeout",
    "destroy_process_group",
    "all_reduce",
    "broadcast",
    "all_gather_object",
    "ReduceOp",
    "CollectiveError",
    "choose_backend",
    "collective_device",
    "warn_if_cpu_model",
    "ParallelEnv",
    "DEFAULT_TIMEOUT_S",
]

ReduceOp = tdist.ReduceOp
logger = logging.getLogger("fleetlite.distributed")

_BACKENDS = ("auto", "gloo", "nccl")
_warned_single = False
_warned_once: set[str] = set()  # one-time notes already given (CPU model under a GPU job, gloo fallback)
_group_timeout: datetime.timedelta | None = None  # the timeout the group was created with


def _collective(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run one blocking collective; turn a dead or late peer into a :class:`CollectiveError` naming it."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:
        # after the peer monitor aborted the group any backend error is that loss (Note [peer monitor])
        if isinstance(e, CollectiveError) or (faults._monitor_error is None and not faults.is_peer_failure(e)):
            raise
        seconds = (_group_timeout or default_timeout()).total_seconds()
        raise faults.peer_lost_error(name, e, seconds) from e


def _resolve_backend(backend: str) -> str:
    if not isinstance(backend, str) or backend.lower() not in _BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(_BACKENDS)} "
                         "('auto' picks nccl with CUDA, gloo otherwise)")
    backend = backend.lower()
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs CUDA, but no CUDA device is available here; "
                         "use backend='gloo' (or 'auto') to run on the CPU")
    return backend


def _warn_once(key: str, message: str, stacklevel: int = 3) -> None:
    if key not in _warned_once:
        _warned_once.add(key)
        warnings.warn(message, stacklevel=stacklevel)


def _served_device_types(group: ProcessGroup | None = None) -> set[str]:
    """Device types the group's backend(s) can move (``cpu:gloo,cuda:nccl`` -> cpu and cuda)."""
    config = str(tdist.get_backend_config(group))
    return {part.split(":")[0].strip() for part in config.split(",") if ":" in part}


def collective_device(device: torch.device | str, group: ProcessGroup | None = None) -> torch.device:
    """Where a small collective (a count, a flag) of a tensor on ``device`` runs for ``group``.

    The tensor's own device when the group's backend serves it (Note
    [per-device backends]), else one it does serve: decided by the tensor,
    not by the backend's name. Without a process group: ``device``.

    >>> collective_device("cpu")
    device(type='cpu')
    """
    device = torch.device(device)
    if not is_initialized():
        return device
    served = _served_device_types(group)
    if device.type in served:
        return device
    if "cuda" in served and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def warn_if_cpu_model(module: torch.nn.Module) -> None:
    """Warn once when a CPU model is trained in a job whose ranks have GPUs (it works, over gloo, slowly).

    For the code that wraps a model for data parallelism; a no-op without
    CUDA or without a process group.
    """
    if not (is_initialized() and torch.cuda.is_available()):
        return
    param = next(iter(module.parameters()), None)
    if param is None or param.device.type != "cpu":
        return
    _warn_once("cpu-model", f"fleetlite: the model is on the CPU but this rank's device is {ParallelEnv().device}: "
                            "it trains correctly (over gloo) but slowly; move it with "
                            "model.to(ParallelEnv().device) to use the GPU", stacklevel=4)


def _as_timedelta(timeout: float | datetime.timedelta | None) -> datetime.timedelta:
    if timeout is None:
        return default_timeout()
    if isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, (int, float)) and timeout > 0:
        return datetime.timedelta(seconds=float(timeout))
    raise ValueError(f"timeout={timeout!r} must be a positive number of seconds or a datetime.timedelta")


def init_parallel_env(backend: str = "auto", timeout: float | datetime.timedelta | None = None) -> ProcessGroup | None:
    """Initialise the process group from the launcher's variables: torchrun's, Paddle's, or a cluster manager's.

    With no launcher, workers that SLURM (``srun``), Open MPI or MPICH /
    Intel MPI (``mpirun``) started join from the manager's variables, and a
    Kubeflow ``PyTorchJob`` pod is local rank 0 of 1 (see
    :func:`fleetlite.distributed.env.read_env`). The environment found is
    logged (logger ``fleetlite.distributed``, INFO) in one line.

    Idempotent: a second call returns the existing group. With world size 1
    it does nothing (a launcher that started one process gets a one-time
    note), so the same script runs single-process (and returns ``None``).
    On CUDA the current device is set, once, to ``ParallelEnv().device``
    (the local rank, or ``FLAGS_selected_gpus``), and NCCL carries the CUDA
    tensors while gloo carries the CPU ones (Note [per-device backends]).

    Args:
        backend: ``"auto"`` (``PADDLE_DISTRI_BACKEND`` when set, e.g. by ``spawn(backend=...)``;
            else ``cpu:gloo,cuda:nccl`` with CUDA, falling back to gloo with a
            warning when this node has more ranks than GPUs; gloo without CUDA),
            ``"gloo"`` or ``"nccl"`` (``cpu:gloo,cuda:nccl``; more ranks than GPUs is a
            :class:`DistEnvError`).
        timeout: seconds (or a ``timedelta``) a collective may wait for a peer;
            default ``FLEETLITE_COLLECTIVE_TIMEOUT`` or 600 s.

    Example::

        import fleetlite.distributed as dist
        dist.init_parallel_env()
        print(dist.get_rank(), dist.get_world_size())
    """
    global _warned_single, _group_timeout
    paddle_backend = os.environ.get("PADDLE_DISTRI_BACKEND", "").strip()  # set by spawn(backend=...)
    requested = backend.lower() if isinstance(backend, str) else backend
    if requested == "auto" and paddle_backend:
        try:
            _resolve_backend(paddle_backend)
        except ValueError as e:
            raise DistEnvError(f"environment variable PADDLE_DISTRI_BACKEND={paddle_backend!r} is not usable: {e}; "
                               "fix or unset it") from None
        requested = paddle_backend.lower()
    else:
        _resolve_backend(backend)
    td = _as_timedelta(timeout)
    if tdist.is_available() and tdist.is_initialized():
        return tdist.group.WORLD
    env = read_env()
    if env.world_size == 1:
        # a plain `python script.py` is single-process by intent: only a launcher saying "1 process" gets a note
        if not _warned_single and env.source != "none":
            warnings.warn("fleetlite: world size is 1, running single-process (no process group created)",
                          stacklevel=2)
            _warned_single = True
        return None
    if not tdist.is_available():
        raise RuntimeError("this torch build has no torch.distributed support; install a standard torch wheel")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    resolved, note = choose_backend(requested, gpus, env.local_world_size)  # Note [per-device backends]
    if note and env.local_rank == 0:  # every rank of the node falls back alike: one line per node
        _warn_once("gloo-fallback", note)
    kwargs = {}
    if gpus:  # every rank works on its own GPU (ParallelEnv().device, the one source), whatever the backend
        device = ParallelEnv().device
        torch.cuda.set_device(device)
        if "nccl" in resolved:
            kwargs["device_id"] = device
    if env.source not in ("torchrun", "kubeflow"):  # Paddle's or a cluster manager's variables: env:// reads these
        os.environ.setdefault("MASTER_ADDR", env.master_addr or "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(env.master_port))
    logger.info("fleetlite: %s", env.describe())  # which environment was found, once per process
    store = _elastic_store(env.world_size, td)
    if store is not None:
        kwargs["store"] = store
    else:
        kwargs["init_method"] = "env://"
    tdist.init_process_group(backend=resolved, rank=env.rank, world_size=env.world_size, timeout=td, **kwargs)
    # Note [gloo exit race]
    atexit.register(_destroy_at_exit)
    _group_timeout = td
    register_process(td.total_seconds())  # Note [lost rank diagnosis]
    start_monitor("nccl" in resolved, td.total_seconds())  # Note [peer monitor]
    return tdist.group.WORLD


def _elastic_store(world_size: int, timeout: datetime.timedelta) -> tdist.Store | None:
    """The store of a worker group started by torchelastic on its agent's shared store, under a per-attempt prefix.

    Note [elastic store reuse]
        torchrun (torch 2.15) keeps ONE TCPStore, served by the agent, for
        every restart of the worker group (``TORCHELASTIC_USE_AGENT_STORE``),
        and ``env://`` puts every attempt's keys under the same names. A
        restarted rank may then read a dead predecessor's gloo address before
        its new peer overwrote it, and the restart fails with "Gloo
        connectFullMesh failed ... Connection refused". Prefixing the keys
        with the restart count gives every attempt its own namespace.
        None (plain ``env://``) outside torchelastic's shared store.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    base = tdist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=timeout)
    return tdist.PrefixStore(f"fleetlite/attempt-{attempt}", base)


def _destroy_at_exit() -> None:
    """Close the process group before the interpreter tears down.

    Note [gloo exit race]
        A gloo worker thread frees a finished collective's work object a moment
        after ``wait()`` returns. If the interpreter is already finalizing when
        that work drops the last reference to a Python-owned tensor, the thread
        needs the GIL, Python ends the thread, and the process aborts
        ("terminate called without an active exception"). Seen with torch 2.15
        in ~1 of 3 runs of a script that exits right after its last all-reduce.
        Giving the workers a moment, with the GIL released, before teardown
        removes the race.
    """
    try:
        if tdist.is_initialized():
            stop_monitor()
            if "gloo" in str(tdist.get_backend_config()):
                time.sleep(0.05)
            tdist.destroy_process_group()
    except Exception:  # exiting anyway; nothing useful to report
        pass


def is_initialized() -> bool:
    """True when a process group exists (world size > 1 after ``init_parallel_env``)."""
    return tdist.is_available() and tdist.is_initialized()


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank (0 when no process group exists)."""
    if is_initialized():
        return tdist.get_rank(group)
    return read_env().rank if group is None else 0


def get_world_size(group: ProcessGroup | None = None) -> int:
    """Number of processes: the group's size, or before ``init_parallel_env`` the launcher's
    ``WORLD_SIZE`` / ``PADDLE_TRAINERS_NUM`` (1 when launched without one), as Paddle does."""
    if is_initialized():
        return tdist.get_world_size(group)
    return read_env().world_size if group is None else 1


def barrier(group: ProcessGroup | None = None) -> None:
    """Wait for every rank; a no-op single-process."""
    if is_initialized():
        _collective("barrier", tdist.barrier, group)


def destroy_process_group() -> None:
    """Tear down the process group if one exists."""
    global _group_timeout
    if is_initialized():
        stop_monitor()
        tdist.destroy_process_group()
    _group_timeout = None


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: ProcessGroup | None = None,
               sync_op: bool = True) -> tdist.Work | None:
    """In-place all-reduce (Paddle signature); identity single-process."""
    if not is_initialized():
        return None
    work = _collective("all_reduce", tdist.all_reduce, tensor, op=op, group=group, async_op=not sync_op)
    return None if sync_op else work


def broadcast(tensor: torch.Tensor, src: int = 0, group: ProcessGroup | None = None,
              sync_op: bool = True) -> tdist.Work | None:
    """In-place broadcast from ``src``; identity single-process."""
    if not is_initialized():
        return None
    work = _collective("broadcast", tdist.broadcast, tensor, src=src, group=group, async_op=not sync_op)
    return None if sync_op else work


def all_gather_object(obj: Any, group: ProcessGroup | None = None) -> list[Any]:
    """Every rank's ``obj``, in rank order (``[obj]`` single-process)."""
    if not is_initialized():
        return [obj]
    out = [None] * tdist.get_world_size(group)
    _collective("all_gather_object", tdist.all_gather_object, out, obj, group=group)
    return out


class ParallelEnv:
    """Paddle's ``ParallelEnv``: the rank, world size and device of this process.

    Values come from the initialised process group when there is one, else
    from the launcher's variables.

    >>> env = ParallelEnv()
    >>> env.rank, env.world_size, env.nranks
    (0, 1, 1)
    """

    def __init__(self) -> None:
        self._env = read_env()

    @property
    def rank(self) -> int:
        return get_rank() if is_initialized() else self._env.rank

    @property
    def world_size(self) -> int:
        return get_world_size() if is_initialized() else self._env.world_size

    nranks = world_size

    @property
    def local_rank(self) -> int:
        return self._env.local_rank

    @property
    def device_id(self) -> int:
        if self._env.selected_gpus:
            return self._env.selected_gpus[0]
        return self._env.local_rank

    dev_id = device_id

    @property
    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.device_id % max(torch.cuda.device_count(), 1))
        return torch.device("cpu")

    @property
    def device_type(self) -> str:
        return self.device.type

    @property
    def trainer_endpoints(self) -> list[str]:
        return list(self._env.trainer_endpoints) or [self._env.current_endpoint]

    @property
    def current_endpoint(self) -> str:
        return self._env.current_endpoint

    def __repr__(self) -> str:
        return (f"ParallelEnv(rank={self.rank}, world_size={self.world_size}, local_rank={self.local_rank}, "
                f"device={self.device})")
