"""The distributed environment, read once from the launcher's variables.

The conventions understood, in this order (the first present wins; ``source`` names it):

* torchrun / torchelastic: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT`` (and ``LOCAL_WORLD_SIZE``);
  a Kubeflow ``PyTorchJob`` sets the same without the local ones (one process
  per pod: local rank 0 of 1; ``source == "kubeflow"``);
* Paddle's launcher, used when the torchrun variables are absent:
  ``PADDLE_TRAINER_ID``, ``PADDLE_TRAINERS_NUM``, ``PADDLE_TRAINER_ENDPOINTS``,
  ``PADDLE_CURRENT_ENDPOINT``, ``FLAGS_selected_gpus``;
* a cluster manager that started the worker itself, with no launcher: Open MPI,
  MPICH / Intel MPI, SLURM's ``srun`` (:mod:`fleetlite.distributed.cluster`);

and fleetlite's own ``FLEETLITE_COLLECTIVE_TIMEOUT``. Nothing here touches
torch.distributed: this module only parses and checks (the bottom of
``fleetlite.distributed``; :class:`~fleetlite.distributed.ParallelEnv`, which
also asks the process group, lives beside it in ``collective``).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .cluster import ClusterEnvError, ClusterVars, detect

__all__ = ["DistEnvError", "DistEnv", "read_env", "choose_backend", "PER_DEVICE_BACKEND", "default_timeout",
           "DEFAULT_TIMEOUT_S"]

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
PADDLE_VARS = (
    "PADDLE_TRAINER_ID",
    "PADDLE_TRAINERS_NUM",
    "PADDLE_TRAINER_ENDPOINTS",
    "PADDLE_CURRENT_ENDPOINT",
    "FLAGS_selected_gpus",
)


class DistEnvError(ValueError):
    """A launcher variable is missing, malformed or inconsistent; the message names it and the fix.

    >>> try:
    ...     read_env({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    ... except DistEnvError as e:
    ...     print(str(e).split(";")[0])
    RANK=2 is outside 0..1 (WORLD_SIZE=2)
    """


@dataclass(frozen=True)
class DistEnv:
    """What the launcher told this process (see :func:`read_env`).

    >>> read_env({"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "1"}).source
    'paddle'
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    trainer_endpoints: tuple[str, ...] = field(default_factory=tuple)
    current_endpoint: str = ""
    selected_gpus: tuple[int, ...] = field(default_factory=tuple)
    source: str = "none"  # "torchrun", "kubeflow", "paddle", "slurm", "openmpi", "mpich" or "none"

    def describe(self) -> str:
        """One line: where this process sits in the job and who said so (logged by ``init_parallel_env``).

        >>> read_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}).describe()
        'rank 1 of 2 (local rank 1 of 2), master h:29500, from torchrun'
        """
        master = f"{self.master_addr}:{self.master_port}" if self.master_addr else "none"
        return (f"rank {self.rank} of {self.world_size} (local rank {self.local_rank} of {self.local_world_size}), "
                f"master {master}, from {self.source}")


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise DistEnvError(f"environment variable {name} is not set; set it (an integer) or start "
                                    "the script with `fleetlite launch`")
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise DistEnvError(
            f"environment variable {name}={raw!r} is not an integer; set it to a whole number "
            "(or unset it and start the script with `fleetlite launch`)"
        ) from None


def _endpoint(name: str, raw: str) -> tuple[str, int]:
    host, sep, port = raw.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DistEnvError(f"{name} entry {raw!r} is not of the form HOST:PORT (e.g. 127.0.0.1:6170)")
    return host, int(port)


def _check_rank(rank: int, world_size: int, rank_name: str, size_name: str) -> None:
    if world_size < 1:
        raise DistEnvError(f"{size_name}={world_size} must be at least 1: set it to the number of processes "
                           "(or unset it to run single-process)")
    if not 0 <= rank < world_size:
        raise DistEnvError(
            f"{rank_name}={rank} is outside 0..{world_size - 1} ({size_name}={world_size}); "
            f"every process needs a distinct rank below the world size"
        )


def _kubeflow(env: Mapping[str, str]) -> bool:
    """A Kubeflow ``PyTorchJob`` pod: torchrun's rank variables in Kubernetes, without torchrun's local ones."""
    in_pod = "KUBERNETES_SERVICE_HOST" in env or "KUBERNETES_PORT" in env
    return in_pod and not any(k in env for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"))


def _read_torchrun(env: Mapping[str, str]) -> DistEnv:
    world_size = _int(env, "WORLD_SIZE", 1)
    rank = _int(env, "RANK", 0)
    _check_rank(rank, world_size, "RANK", "WORLD_SIZE")
    pod = _kubeflow(env)  # one process per pod (as Lightning's KubeflowEnvironment): local rank 0 of 1
    local_rank = _int(env, "LOCAL_RANK", rank if world_size > 1 and "LOCAL_WORLD_SIZE" not in env and not pod else 0)
    local_world_size = _int(env, "LOCAL_WORLD_SIZE", 1 if pod else world_size)
    _check_rank(local_rank, local_world_size, "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if local_world_size > world_size:
        raise DistEnvError(f"LOCAL_WORLD_SIZE={local_world_size} exceeds WORLD_SIZE={world_size}; a node cannot "
                           "run more processes than the whole job: fix one of the two")
    addr = env.get("MASTER_ADDR") or None
    port_raw = env.get("MASTER_PORT")
    port = _int(env, "MASTER_PORT") if port_raw not in (None, "") else None
    if world_size > 1 and (addr is None or port is None):
        missing = "MASTER_ADDR" if addr is None else "MASTER_PORT"
        raise DistEnvError(
            f"WORLD_SIZE={world_size} but {missing} is not set: the ranks cannot find each other. "
            "Set MASTER_ADDR and MASTER_PORT, or start the script with `fleetlite launch`"
        )
    if port is not None and not 0 < port < 65536:
        raise DistEnvError(f"MASTER_PORT={port} is not a valid TCP port (1..65535)")
    endpoints, current = _torchrun_endpoints(env, rank, world_size, local_rank, local_world_size, addr, port)
    gpus = _gpus(env)
    return DistEnv(rank, world_size, local_rank, local_world_size, addr, port, endpoints, current, gpus,
                   "kubeflow" if pod else "torchrun")


def _read_cluster(found: ClusterVars, env: Mapping[str, str]) -> DistEnv:
    """The environment of a worker its cluster manager started (no launcher): checked like torchrun's."""
    rank_name, size_name, local_name, local_size_name = found.names
    _check_rank(found.rank, found.world_size, rank_name, size_name)
    _check_rank(found.local_rank, found.local_world_size, local_name, local_size_name)
    if found.world_size > 1 and found.master_addr is None:
        raise DistEnvError(f"{size_name}={found.world_size} ({found.source}) but no master address is known: set "
                           "MASTER_ADDR to the first node's host name (SLURM: SLURM_JOB_NODELIST gives it)")
    endpoints: tuple[str, ...] = ()
    current = ""
    if found.local_world_size == found.world_size and found.master_port is not None:  # one node: all known
        endpoints = tuple(trainer_endpoint(found.master_addr or "127.0.0.1", found.master_port, i)
                          for i in range(found.world_size))
        current = endpoints[found.rank]
    return DistEnv(found.rank, found.world_size, found.local_rank, found.local_world_size, found.master_addr,
                   found.master_port, endpoints, current, _gpus(env), found.source)


def _torchrun_endpoints(env: Mapping[str, str], rank: int, world_size: int, local_rank: int,
                        local_world_size: int, addr: str | None, port: int | None) -> tuple[tuple[str, ...], str]:
    """Paddle's endpoint list under torchrun's variables.

    ``fleetlite launch`` and ``spawn`` export ``PADDLE_TRAINER_ENDPOINTS``; they
    are used when they agree with ``RANK``/``WORLD_SIZE`` (stale values left in
    a shell are ignored). Otherwise, on one node, the list is derived the way
    the launcher derives it: ``MASTER_ADDR:MASTER_PORT+1+rank``.
    """
    raw = env.get("PADDLE_TRAINER_ENDPOINTS", "").strip()
    listed = tuple(e.strip() for e in raw.split(",") if e.strip())
    trainer_id = env.get("PADDLE_TRAINER_ID", str(rank)).strip()
    if len(listed) == world_size and trainer_id == str(rank):
        for e in listed:
            _endpoint("PADDLE_TRAINER_ENDPOINTS", e)
        current = env.get("PADDLE_CURRENT_ENDPOINT", "").strip() or listed[rank]
        return listed, current
    host = addr or "127.0.0.1"
    base = port or 6170
    if local_world_size == world_size:  # a single node: every endpoint is known
        endpoints = tuple(trainer_endpoint(host, base, i) for i in range(world_size))
        return endpoints, endpoints[rank]
    return (), ""  # other nodes' hosts are unknown here (`fleetlite launch` exchanges them)


def trainer_endpoint(host: str, master_port: int, rank: int) -> str:
    """Paddle's ``HOST:PORT`` for ``rank``: informational ports above the master port (one per trainer)."""
    return f"{host}:{master_port + 1 + rank}"


def _gpus(env: Mapping[str, str]) -> tuple[int, ...]:
    raw = env.get("FLAGS_selected_gpus", "").strip()
    if not raw:
        return ()
    try:
        return tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise DistEnvError(
            f"FLAGS_selected_gpus={raw!r} is not a comma-separated list of GPU indices (e.g. '0' or '0,1')"
        ) from None


def _read_paddle(env: Mapping[str, str]) -> DistEnv:
    rank = _int(env, "PADDLE_TRAINER_ID", 0)
    world_size = _int(env, "PADDLE_TRAINERS_NUM", 1)
    _check_rank(rank, world_size, "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM")
    eps_raw = env.get("PADDLE_TRAINER_ENDPOINTS", "").strip()
    endpoints = tuple(e.strip() for e in eps_raw.split(",") if e.strip())
    for e in endpoints:
        _endpoint("PADDLE_TRAINER_ENDPOINTS", e)
    if world_size > 1 and not endpoints:
        raise DistEnvError(
            f"PADDLE_TRAINERS_NUM={world_size} but PADDLE_TRAINER_ENDPOINTS is not set: the ranks cannot "
            "find each other. Set it to a comma-separated HOST:PORT list, or use `fleetlite launch`"
        )
    if endpoints and len(endpoints) != world_size:
        raise DistEnvError(
            f"PADDLE_TRAINER_ENDPOINTS lists {len(endpoints)} endpoints but PADDLE_TRAINERS_NUM={world_size}; "
            "give one HOST:PORT per trainer"
        )
    current = env.get("PADDLE_CURRENT_ENDPOINT", "").strip() or (endpoints[rank] if endpoints else "")
    if current:
        _endpoint("PADDLE_CURRENT_ENDPOINT", current)
    if endpoints and current and current != endpoints[rank]:
        raise DistEnvError(
            f"PADDLE_CURRENT_ENDPOINT={current} differs from entry {rank} of PADDLE_TRAINER_ENDPOINTS "
            f"({endpoints[rank]}) for PADDLE_TRAINER_ID={rank}; make them agree"
        )
    addr, port = _endpoint("PADDLE_TRAINER_ENDPOINTS", endpoints[0]) if endpoints else (None, None)
    cur_host = current.rpartition(":")[0] if current else None
    local_peers = [e for e in endpoints if e.rpartition(":")[0] == cur_host] if endpoints else []
    local_rank = local_peers.index(current) if current in local_peers else 0
    gpus = _gpus(env)
    return DistEnv(rank, world_size, local_rank, max(len(local_peers), 1), addr, port, endpoints, current,
                   gpus, "paddle")


def read_env(env: Mapping[str, str] | None = None) -> DistEnv:
    """Parse the launcher variables of ``env`` (default ``os.environ``).

    torchrun's variables win; Paddle's are read only when none of torchrun's
    rank variables is present, and a cluster manager's (MPI, SLURM) only when
    neither is: a launcher started under ``srun`` or ``mpirun`` describes its
    own workers. Raises :class:`DistEnvError` with the variable and the fix on
    bad input.

    >>> read_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}).rank
    1
    """
    env = os.environ if env is None else env
    if any(k in env for k in ("RANK", "WORLD_SIZE")):
        return _read_torchrun(env)
    if any(k in env for k in ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS")):
        return _read_paddle(env)
    try:
        found = detect(env)
    except ClusterEnvError as e:
        raise DistEnvError(str(e)) from None
    if found is not None:
        return _read_cluster(found, env)
    return DistEnv(selected_gpus=_gpus(env))


#: What ``init_parallel_env`` gives torch when CUDA is used: CPU tensors over gloo, CUDA tensors over NCCL.
PER_DEVICE_BACKEND = "cpu:gloo,cuda:nccl"


def choose_backend(requested: str, gpu_count: int, local_world_size: int) -> tuple[str, str | None]:
    """The backend string for ``torch.distributed.init_process_group`` and a one-line warning (or None).

    Note [per-device backends]
        NCCL moves CUDA tensors only; a CPU model, a metric summed on the CPU
        or a found-inf flag on the CPU would fail with "No backend type
        associated with device type cpu". With CUDA the group is therefore
        made with one backend per device type, ``cpu:gloo,cuda:nccl``: each
        tensor goes over the backend of its own device. NCCL also needs one
        GPU per rank ("Duplicate GPU detected"): with more ranks on this node
        than visible GPUs, ``auto`` falls back to gloo (the ranks share the
        GPUs, slowly but correctly) and an explicit ``nccl`` is an error.

    Args:
        requested: ``"auto"``, ``"gloo"`` or ``"nccl"``.
        gpu_count: visible CUDA devices (0 without CUDA).
        local_world_size: ranks on this node.

    >>> choose_backend("auto", 2, 2)
    ('cpu:gloo,cuda:nccl', None)
    >>> choose_backend("auto", 0, 2)
    ('gloo', None)
    """
    if requested == "gloo" or (requested == "auto" and gpu_count == 0):
        return "gloo", None
    if gpu_count == 0:
        raise ValueError("backend 'nccl' needs CUDA, but no CUDA device is available here; "
                         "use backend='gloo' (or 'auto') to run on the CPU")
    if local_world_size > gpu_count:
        if requested == "nccl":
            raise DistEnvError(
                f"backend='nccl' needs one GPU per rank, but this node runs {local_world_size} ranks "
                f"(LOCAL_WORLD_SIZE / --nproc_per_node) and sees {gpu_count} GPU(s) (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); start at most {gpu_count} ranks per node, "
                "make more GPUs visible, or use backend='gloo' (or 'auto', which falls back to gloo)")
        return "gloo", (f"fleetlite: {local_world_size} ranks on this node but {gpu_count} visible GPU(s): NCCL "
                        "needs one GPU per rank, so the group uses gloo and the ranks share GPUs (slower); start "
                        f"at most {gpu_count} ranks per node to use NCCL")
    return PER_DEVICE_BACKEND, None


#: Seconds a collective may wait for a peer before failing (env ``FLEETLITE_COLLECTIVE_TIMEOUT``).
DEFAULT_TIMEOUT_S = 600.0


def default_timeout() -> datetime.timedelta:
    """The collective timeout: ``FLEETLITE_COLLECTIVE_TIMEOUT`` seconds, else 600 s."""
    raw = os.environ.get("FLEETLITE_COLLECTIVE_TIMEOUT", "").strip()
    if not raw:
        return datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(raw)
    except ValueError:
        raise DistEnvError(
            f"FLEETLITE_COLLECTIVE_TIMEOUT={raw!r} is not a number of seconds; set e.g. 600"
        ) from None
    if seconds <= 0:
        raise DistEnvError(f"FLEETLITE_COLLECTIVE_TIMEOUT={raw!r} must be positive (seconds)")
    return datetime.timedelta(seconds=seconds)
