"""What ``fleetlite launch`` adds to torchrun's options: Paddle's launcher flags and a SLURM job's nodes.

Paddle's ``python -m paddle.distributed.launch`` flags, with Paddle's meaning, become torchrun options:

==========================  =================================================================================
Paddle                      torchrun
==========================  =================================================================================
``--ips A,B``               ``--nnodes 2 --master_addr A --master_port START --node_rank <this node's index>``
                            (this node found by its own address, or ``--host``; one address: ``--standalone``)
``--master H:P``            with ``--rank R``: ``--master_addr H --master_port P --node_rank R``; without
                            (Paddle's rank -1, assigned on joining): ``--rdzv_backend c10d --rdzv_endpoint H:P``
``--rank R``                ``--node_rank R`` (the node's rank, not a process's)
``--nnodes N``              ``--nnodes N`` (also ``MIN:MAX``)
``--devices`` / ``--gpus``  ``CUDA_VISIBLE_DEVICES`` and one process per device (``launch.resolve_argv``)
``--log_dir D``             every process's output in ``D/workerlog.N``, rank 0's also on the console
                            (torchrun's ``--log_dir D --tee 3 --local_ranks_filter 0``)
``--start_port P``          the master port with ``--ips`` (Paddle's default 6070)
==========================  =================================================================================

Under ``srun`` with one task per node (``sbatch --ntasks-per-node=1``), ``--nnodes``, ``--node_rank`` and
the master (the first host of ``SLURM_JOB_NODELIST``, the port from the job id) come from SLURM when not
given (:func:`slurm_options`).
"""

from __future__ import annotations

import glob
import os
import socket
from collections.abc import Callable, Mapping, MutableMapping

from . import cluster

__all__ = ["paddle_options", "slurm_options", "link_worker_logs", "PADDLE_START_PORT"]

#: Paddle's ``--start_port`` default (paddle.distributed.launch): the first port of the job's endpoints.
PADDLE_START_PORT = 6070
_PADDLE_FLAGS = ("--ips", "--master", "--rank", "--host", "--start_port", "--log_dir", "--log-dir")
_PLACEMENT = ("--nnodes", "--node_rank", "--node-rank", "--master_addr", "--master-addr", "--master_port",
              "--master-port", "--rdzv_endpoint", "--rdzv-endpoint", "--rdzv_backend", "--rdzv-backend",
              "--standalone")


def _fail(message: str) -> SystemExit:
    return SystemExit(f"fleetlite launch: {message}")


def _given(options: list[str], *names: str) -> str | None:
    """The value of the first of ``names`` among ``options`` (``""`` for a flag), None when absent."""
    for i, tok in enumerate(options):
        name, eq, value = tok.partition("=")
        if name in names:
            if eq:
                return value
            nxt = options[i + 1] if i + 1 < len(options) else ""
            return nxt if nxt and not nxt.startswith("-") else ""
    return None


def paddle_options(options: list[str], takes_value: Callable[[str], bool],
                   local_addresses: Callable[[], set[str]] | None = None) -> tuple[list[str], str | None]:
    """torchrun's options for the launcher ``options`` (before the script), Paddle's flags translated.

    Returns the options and Paddle's log directory (``--log_dir``), if given. ``takes_value`` tells which
    of torchrun's options take a value; ``local_addresses`` (default: this machine's) finds this node in ``--ips``.

    >>> paddle_options(["--master", "10.0.0.1:29555", "--rank", "1", "--nnodes", "2"], lambda o: True)[0]
    ['--nnodes', '2', '--master_addr', '10.0.0.1', '--master_port', '29555', '--node_rank', '1']
    """
    found: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(options):
        tok = options[i]
        name, eq, value = tok.partition("=")
        if name in _PADDLE_FLAGS:
            if not eq:
                nxt = options[i + 1] if i + 1 < len(options) else ""
                if not nxt or (nxt.startswith("-") and not nxt.lstrip("-").isdigit()):  # --rank -1 is a value
                    raise _fail(f"{name} needs a value, e.g. {_EXAMPLES[name.replace('-', '_').lstrip('_')]}")
                value = options[i + 1]
                i += 1
            found[name.replace("--log-dir", "--log_dir")] = value.strip()
            i += 1
            continue
        rest.append(tok)
        if not eq and i + 1 < len(options) and takes_value(name):
            rest.append(options[i + 1])
            i += 1
        i += 1
    out = rest
    ips, master, rank = found.get("--ips"), found.get("--master"), found.get("--rank")
    if rank is not None and not rank.lstrip("-").isdigit():
        raise _fail(f"--rank {rank!r} must be this node's rank (0, 1, ...; Paddle's -1: assigned on joining)")
    node_rank = int(rank) if rank is not None and int(rank) >= 0 else None
    if ips is not None or master is not None:
        clash = [o for o in _PLACEMENT if o != "--nnodes" and _given(rest, o) is not None]
        if ips is not None and master is not None:
            clash.append("--master")
        if clash:
            raise _fail(f"{'--ips' if ips is not None else '--master'} says where the nodes meet, and so does "
                        f"{clash[0]}: give one of them")
    if ips is not None:
        out = _ips(out, ips, node_rank, found, local_addresses or _local_addresses)
    elif master is not None:
        out = _master(out, master, node_rank)
    elif node_rank is not None:
        if _given(rest, "--node_rank", "--node-rank") is not None:
            raise _fail("--rank (Paddle's node rank) and --node_rank say the same thing: give one of them")
        out = [*out, "--node_rank", str(node_rank)]
    log_dir = found.get("--log_dir")
    if log_dir:
        out = [*out, "--log_dir", log_dir]
        if _given(rest, "--redirects", "-r", "--tee", "-t") is None:
            out += ["--tee", "3"]
        if _given(rest, "--local_ranks_filter", "--local-ranks-filter") is None:
            out += ["--local_ranks_filter", "0"]
    return out, log_dir


_EXAMPLES = {"ips": "--ips 10.0.0.1,10.0.0.2", "master": "--master 10.0.0.1:29555", "rank": "--rank 0",
             "host": "--host 10.0.0.2", "start_port": "--start_port 6070", "log_dir": "--log_dir log"}


def _port(text: str, what: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise _fail(f"{what} {text!r} is not a TCP port (1..65535)")
    return int(text)


def _ips(out: list[str], ips: str, node_rank: int | None, found: Mapping[str, str],
         local_addresses: Callable[[], set[str]]) -> list[str]:
    hosts = [h.strip() for h in ips.split(",") if h.strip()]
    if not hosts or len(set(hosts)) != len(hosts):
        raise _fail(f"--ips {ips!r} must list each node's address once, e.g. --ips 10.0.0.1,10.0.0.2")
    given_nnodes = _given(out, "--nnodes")
    if given_nnodes is not None and given_nnodes != str(len(hosts)):
        raise _fail(f"--nnodes {given_nnodes} but --ips lists {len(hosts)} node(s): give one address per node")
    port = _port(found["--start_port"], "--start_port") if "--start_port" in found else None
    if len(hosts) == 1 and port is None:
        return [*out, "--standalone"]  # one node: torchrun picks a free port itself
    if node_rank is None:
        mine = {found["--host"]} if "--host" in found else local_addresses()
        matches = [i for i, h in enumerate(hosts) if h in mine or _resolve(h) in mine]
        if len(matches) != 1:
            which = "none" if not matches else "several"
            raise _fail(f"--ips {ips}: {which} of these addresses is this node's ({', '.join(sorted(mine))}); "
                        "pass --host <this node's address> or --rank <its index in --ips>")
        node_rank = matches[0]
    if node_rank >= len(hosts):
        raise _fail(f"--rank {node_rank} is outside --ips {ips} (0..{len(hosts) - 1})")
    nnodes = [] if given_nnodes is not None else ["--nnodes", str(len(hosts))]
    return [*out, *nnodes, "--master_addr", hosts[0], "--master_port", str(port or PADDLE_START_PORT),
            "--node_rank", str(node_rank)]


def _master(out: list[str], master: str, node_rank: int | None) -> list[str]:
    scheme, sep, rest = master.partition("://")
    if not sep:
        scheme, rest = "", master
    if scheme not in ("", "http", "etcd"):
        raise _fail(f"--master {master!r}: use HOST:PORT (or etcd://HOST:PORT)")
    host, colon, port = rest.rstrip("/").rpartition(":")
    if not colon or not host:
        raise _fail(f"--master {master!r} is not HOST:PORT, e.g. --master 10.0.0.1:29555")
    _port(port, "--master port")
    if scheme == "etcd":
        return [*out, "--rdzv_backend", "etcd-v2", "--rdzv_endpoint", f"{host}:{port}"]
    if node_rank is None:  # Paddle's rank -1: the rendezvous assigns the nodes' ranks as they join
        return [*out, "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{host}:{port}"]
    return [*out, "--master_addr", host, "--master_port", port, "--node_rank", str(node_rank)]


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _local_addresses() -> set[str]:
    """This machine's names and addresses (Paddle's node IP: ``POD_IP``, else the host's addresses)."""
    if os.environ.get("POD_IP"):
        return {os.environ["POD_IP"]}
    names = {"127.0.0.1", "localhost", socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        try:
            names.update(str(info[4][0]) for info in socket.getaddrinfo(name, None, socket.AF_INET))
        except OSError:
            pass
    return {str(n) for n in names}


#: Variables srun sets for the tasks of a job step (the batch script does not have them).
_SRUN_MARKS = ("SLURM_STEP_NUM_TASKS", "SLURM_SRUN_COMM_HOST")


def slurm_options(options: list[str], environ: Mapping[str, str]) -> tuple[list[str], str | None]:
    """Options a launch under ``srun`` (one task per node) takes from SLURM, and the line saying so (or None).

    Nothing is added outside a SLURM task, inside a launcher's worker, when the options already say where
    the nodes meet, or in the batch script itself (not started by srun: ``SLURM_STEP_NUM_TASKS`` unset).

    >>> slurm_options([], {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
    ...                    "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "31337", "SLURM_STEP_NUM_TASKS": "2"})[0]
    ['--nnodes', '2', '--node_rank', '1', '--master_addr', 'gpu07', '--master_port', '16337']
    """
    if not cluster.slurm_job(environ) or (environ.get(cluster.CHOICE_VAR) or "").strip().lower() == "none" \
            or "RANK" in environ:
        return options, None
    if any(_given(options, o) is not None for o in _PLACEMENT):
        return options, None
    try:
        nnodes = cluster._int(environ, "SLURM_STEP_NUM_NODES", cluster._int(environ, "SLURM_NNODES", 1))
        if nnodes > 1 and not any(environ.get(v) for v in _SRUN_MARKS):
            # the batch script itself runs on the first node only: waiting for the others would never end
            return options, (f"a SLURM job on {nnodes} nodes, but this launch was not started by srun: it runs on this "
                             "node only; to use every node: srun --ntasks-per-node=1 fleetlite launch ...")
        tasks = cluster._int(environ, "SLURM_STEP_NUM_TASKS", cluster._int(environ, "SLURM_NTASKS"))
        node = cluster._int(environ, "SLURM_NODEID", cluster._int(environ, "SLURM_PROCID"))
        addr, port = cluster._slurm_master(environ)
    except cluster.ClusterEnvError as e:
        raise _fail(str(e)) from None
    if nnodes <= 1:
        return options, None
    if tasks != nnodes:
        return options, (f"SLURM job of {tasks} task(s) on {nnodes} nodes: this launch runs on this node only; to "
                         "use every node run it once per node: srun --ntasks-per-node=1 fleetlite launch ...")
    if addr is None:
        raise _fail("under srun, but SLURM_JOB_NODELIST is not set: set MASTER_ADDR to the first node's host name")
    added = ["--nnodes", str(nnodes), "--node_rank", str(node), "--master_addr", addr, "--master_port", str(port)]
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or "?"
    return [*options, *added], f"SLURM job {job}: node {node} of {nnodes}, master {addr}:{port}"


def link_worker_logs(log_dir: str, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """``LOG_DIR/workerlog.N`` -> the newest attempt's output of local rank N (Paddle's names); the links made.

    torchrun writes ``LOG_DIR/<run id>_<random>/attempt_K/N/{stdout,stderr}.log``; Paddle users look for
    ``workerlog.N``. stdout and stderr stay two files: ``workerlog.N`` is stdout, ``workerlog.N.err`` stderr.
    """
    made: list[str] = []
    runs = sorted(glob.glob(os.path.join(log_dir, "*", "attempt_*")), key=os.path.getmtime)
    if not runs:
        return made
    latest = runs[-1]
    for rank_dir in sorted(glob.glob(os.path.join(latest, "*"))):
        n = os.path.basename(rank_dir)
        for stream, suffix in (("stdout.log", ""), ("stderr.log", ".err")):
            src = os.path.join(rank_dir, stream)
            dst = os.path.join(log_dir, f"workerlog.{n}{suffix}")
            if not os.path.exists(src):
                continue
            try:
                if os.path.lexists(dst):
                    os.remove(dst)
                os.symlink(os.path.relpath(src, log_dir), dst)
                made.append(dst)
            except OSError:
                pass
    return made
