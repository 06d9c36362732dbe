"""Workers started by a cluster manager: SLURM, Open MPI, MPICH / Intel MPI (``srun``, ``mpirun``).

Each manager tells a process its place in the job in variables of its own;
:func:`detect` turns them into one :class:`ClusterVars` (rank, world size,
local rank and size, master address and port) that
:func:`fleetlite.distributed.env.read_env` checks and uses when no launcher
(torchrun, Paddle's) has set its variables. The meanings follow Lightning's
``SLURMEnvironment`` / ``MPIEnvironment`` and the managers' manuals:

========  =====================  =======================  ==========================  ==========================
manager   rank                   world size               local rank / size           master
========  =====================  =======================  ==========================  ==========================
SLURM     ``SLURM_PROCID``       ``SLURM_NTASKS``         ``SLURM_LOCALID`` /         first host of
                                                          ``SLURM_NTASKS_PER_NODE``   ``SLURM_JOB_NODELIST``;
                                                          (tasks on this node)        port from ``SLURM_JOB_ID``
Open MPI  ``OMPI_COMM_WORLD_     ``OMPI_COMM_WORLD_SIZE`` ``OMPI_COMM_WORLD_LOCAL_    ``MASTER_ADDR`` /
          RANK``                                          RANK`` / ``..._LOCAL_SIZE`` ``MASTER_PORT``
MPICH,    ``PMI_RANK``           ``PMI_SIZE``             ``MPI_LOCALRANKID`` /       ``MASTER_ADDR`` /
Intel MPI                                                 ``MPI_LOCALNRANKS``         ``MASTER_PORT``
========  =====================  =======================  ==========================  ==========================

``MASTER_ADDR`` / ``MASTER_PORT``, when set, win everywhere. Under MPI on one
node the address defaults to ``127.0.0.1``; the port must be given (MPI has no
job id every rank can read), e.g. ``mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500``.
SLURM's interactive shells (job name ``bash`` or ``interactive``, as in
Lightning) are not a job of several workers. ``FLEETLITE_CLUSTER_ENV=none``
ignores every manager's variables (e.g. a plain ``python`` in an ``sbatch``
script of several tasks); ``=slurm`` / ``openmpi`` / ``mpich`` reads only that one.

Pre-emption on SLURM: :func:`requeue_slurm_job` puts the job back in the queue
(``fleetlite.callbacks.Preemption(requeue=...)``).

Nothing here imports torch: this module only parses strings (below ``env``).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ClusterVars", "ClusterEnvError", "detect", "expand_hostlist", "slurm_master_port", "slurm_job",
           "slurm_job_id", "requeue_slurm_job", "tasks_per_node", "SOURCES"]

#: The names :func:`detect` can report (``DistEnv.source``), and what ``FLEETLITE_CLUSTER_ENV`` accepts.
SOURCES = ("slurm", "openmpi", "mpich")
CHOICE_VAR = "FLEETLITE_CLUSTER_ENV"
_SLURM_INTERACTIVE = ("bash", "interactive")


class ClusterEnvError(ValueError):
    """A cluster manager's variable is malformed or a needed one is missing (``read_env`` re-raises it as
    ``DistEnvError``)."""


@dataclass(frozen=True)
class ClusterVars:
    """A worker's place in the job, as its cluster manager says it; ``names`` are the variables read.

    >>> detect({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODELIST": "node[0-1]"}).master_addr
    'node0'
    """

    source: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None
    names: tuple[str, str, str, str] = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        if default is None:
            raise ClusterEnvError(f"environment variable {name} is not set; the cluster manager sets it for the "
                                  "processes it starts (run the script with srun / mpirun)")
        return default
    # SLURM writes counts such as SLURM_NTASKS_PER_NODE as "2(x3)" or "2,1": the first count is this layout's
    m = re.match(r"^(\d+)", raw)
    if not m:
        raise ClusterEnvError(f"environment variable {name}={raw!r} is not an integer; it is the cluster manager's "
                              f"to set: unset it, or set {CHOICE_VAR}=none to ignore the manager's variables")
    return int(m.group(1))


def _port(env: Mapping[str, str]) -> int | None:
    raw = (env.get("MASTER_PORT") or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ClusterEnvError(f"MASTER_PORT={raw!r} is not a valid TCP port (1..65535)")
    return int(raw)


def expand_hostlist(hostlist: str) -> list[str]:
    """SLURM's compressed host list, expanded in order (``node[01-03,7],gpu1`` -> 4 names).

    >>> expand_hostlist("node[0-1]")
    ['node0', 'node1']
    >>> expand_hostlist("gpu[008-009,011],login2")
    ['gpu008', 'gpu009', 'gpu011', 'login2']
    """
    hosts: list[str] = []
    for item in _split_top_level(hostlist.strip()):
        hosts.extend(_expand_one(item, hostlist))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [i.strip() for i in items if i.strip()]


def _expand_one(item: str, whole: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if m is None:
        if "[" in item or "]" in item:
            raise ClusterEnvError(f"SLURM node list {whole!r} is malformed (unbalanced brackets)")
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    out: list[str] = []
    for part in m.group(1).split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ClusterEnvError(f"SLURM node list {whole!r} has a range {part!r} that is not N or N-M")
        for n in range(int(lo), int(hi if sep else lo) + 1):
            out.extend(f"{head}{n:0{len(lo)}d}{rest}" for rest in _expand_one(tail, whole))
    return out


def tasks_per_node(layout: str) -> list[int]:
    """SLURM's compressed tasks-per-node layout, one count per node.

    >>> tasks_per_node("2(x3),1")
    [2, 2, 2, 1]
    """
    counts: list[int] = []
    for part in layout.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise ClusterEnvError(f"SLURM tasks-per-node layout {layout!r} is not of the form N or N(xM), ...")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def slurm_master_port(job_id: str | None) -> int:
    """The port every task of a SLURM job computes alike: the last 4 digits of the job id + 15000 (as
    Lightning's ``SLURMEnvironment``), 12910 without a job id.

    >>> slurm_master_port("4312345")
    17345
    """
    digits = re.sub(r"\D", "", job_id or "")
    return 15000 + int(digits[-4:]) if digits else 12910


def slurm_job(env: Mapping[str, str]) -> bool:
    """Whether ``env`` is a task that ``srun`` started (SLURM's variables, not an interactive shell)."""
    if not (env.get("SLURM_PROCID") and env.get("SLURM_NTASKS")):
        return False
    return env.get("SLURM_JOB_NAME", "") not in _SLURM_INTERACTIVE


def _slurm_master(env: Mapping[str, str]) -> tuple[str | None, int]:
    addr = (env.get("MASTER_ADDR") or "").strip() or None
    if addr is None:
        nodes = (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "").strip()
        hosts = expand_hostlist(nodes) if nodes else []
        addr = hosts[0] if hosts else None
    port = _port(env)
    return addr, port if port is not None else slurm_master_port(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))


def _read_slurm(env: Mapping[str, str]) -> ClusterVars:
    world = _int(env, "SLURM_NTASKS")
    rank = _int(env, "SLURM_PROCID")
    local_rank = _int(env, "SLURM_LOCALID", 0)
    nnodes = _int(env, "SLURM_NNODES", _int(env, "SLURM_JOB_NUM_NODES", 1))
    # tasks on this node: SLURM's per-node layout ("2(x3),1": 2 on each of the first 3 nodes, 1 on the 4th),
    # at this node's index; else an even split
    per_node_name = next((n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
                          if env.get(n)), None)
    local_world = max(world // max(nnodes, 1), 1)
    if per_node_name:
        layout = tasks_per_node(env[per_node_name])
        node = _int(env, "SLURM_NODEID", 0)
        local_world = layout[node] if node < len(layout) else layout[-1]
    local_world = max(local_world, local_rank + 1)
    addr, port = _slurm_master(env)
    if addr is None and world == local_world:
        addr = "127.0.0.1"  # one node: no node list needed
    return ClusterVars("slurm", rank, world, local_rank, local_world, addr, port,
                       ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", per_node_name or "SLURM_NNODES"))


def _read_mpi(env: Mapping[str, str], source: str, names: tuple[str, str, str, str]) -> ClusterVars:
    rank, world = _int(env, names[0]), _int(env, names[1])
    local_rank = _int(env, names[2], 0 if world == 1 else rank)
    local_world = _int(env, names[3], world if names[2] not in env else max(local_rank + 1, 1))
    addr = (env.get("MASTER_ADDR") or "").strip() or None
    if addr is None and names[3] in env and local_world == world:
        addr = "127.0.0.1"  # the manager says every rank is on this node
    port = _port(env)
    if world > 1 and 0 <= rank < world and (addr is None or port is None):  # a bad rank is reported first (env)
        missing = " and ".join(n for n, v in (("MASTER_ADDR", addr), ("MASTER_PORT", port)) if v is None)
        raise ClusterEnvError(f"{names[1]}={world} ({source}) but {missing} is not set: MPI gives no address every "
                              "rank can find; pass them to every rank, e.g. mpirun -x MASTER_ADDR=<first host> "
                              "-x MASTER_PORT=29500 (Open MPI) or -genv MASTER_ADDR ... (MPICH, Intel MPI)")
    return ClusterVars(source, rank, world, local_rank, local_world, addr, port, names)


_OPENMPI = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
_MPICH = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def detect(env: Mapping[str, str]) -> ClusterVars | None:
    """The cluster manager that started this process, from its variables (None: none did).

    MPI is looked at first: ``mpirun`` inside a SLURM allocation starts the
    ranks, and the allocation's SLURM variables describe the batch script.
    ``FLEETLITE_CLUSTER_ENV`` chooses one manager, or ``none``.

    >>> detect({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}).source
    'openmpi'
    >>> detect({}) is None
    True
    """
    choice = (env.get(CHOICE_VAR) or "").strip().lower()
    if choice and choice not in (*SOURCES, "none", "auto"):
        raise ClusterEnvError(f"{CHOICE_VAR}={choice!r} is not one of {', '.join((*SOURCES, 'auto', 'none'))}")
    if choice == "none":
        return None
    if choice in ("", "auto", "openmpi") and _OPENMPI[0] in env:
        return _read_mpi(env, "openmpi", _OPENMPI)
    if choice in ("", "auto", "mpich") and _MPICH[0] in env and _MPICH[1] in env:
        return _read_mpi(env, "mpich", _MPICH)
    if choice in ("", "auto", "slurm") and slurm_job(env):
        return _read_slurm(env)
    return None


def slurm_job_id(env: Mapping[str, str]) -> str | None:
    """The id ``scontrol requeue`` takes: ``ARRAYJOB_TASK`` for a job array's task, else ``SLURM_JOB_ID``."""
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None


def requeue_slurm_job(env: Mapping[str, str]) -> tuple[bool, str]:
    """Run ``scontrol requeue <job id>`` (as Lightning's auto-requeue); (whether it worked, one line saying so).

    SLURM then ends this job and queues it again with the same id: the new run continues from the last
    checkpoint (``resume=auto``).
    """
    job = slurm_job_id(env)
    if job is None:
        return False, "not requeued: SLURM_JOB_ID is not set (not a SLURM job)"
    try:
        res = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"could not requeue SLURM job {job}: `scontrol requeue {job}` failed to run ({e})"
    if res.returncode != 0:
        why = " ".join((res.stderr or res.stdout).split())[:200]
        return False, (f"could not requeue SLURM job {job}: scontrol exited {res.returncode} ({why}); the job needs "
                       "#SBATCH --requeue (or the cluster's JobRequeue=1)")
    return True, f"SLURM job {job} requeued: it continues from the last checkpoint when it starts again"
