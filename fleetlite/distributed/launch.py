"""``fleetlite launch``: a thin front over ``torch.distributed.run`` (torchrun).

Every torchrun option works unchanged (``--nproc_per_node``, ``--nnodes``,
``--rdzv_backend``, ``--rdzv_endpoint``, ``--max_restarts``, ``--standalone``,
...). On top of torchrun it:

* accepts Paddle's ``--gpus`` / ``--devices`` / ``--selected_gpus`` (sets ``CUDA_VISIBLE_DEVICES``
  and, unless given, ``--nproc_per_node``) and Paddle's ``--ips``, ``--master``, ``--rank``,
  ``--log_dir``, with Paddle's meaning (:mod:`fleetlite.distributed.launch_flags`);
* under ``srun`` with one task per node, takes ``--nnodes``, ``--node_rank`` and the
  master from SLURM;
* reports a rendezvous that fails (a node that does not join in time, an unreachable
  master, a port in use) in one line naming the endpoint and what to check;
* runs each worker through a small bootstrap that also exports Paddle's
  ``PADDLE_TRAINER_ID`` / ``PADDLE_TRAINERS_NUM`` / ``PADDLE_TRAINER_ENDPOINTS`` /
  ``PADDLE_CURRENT_ENDPOINT`` / ``FLAGS_selected_gpus`` so Paddle-style scripts work;
* exports ``FLEETLITE_LAUNCH_TIME`` (when the launch started) to every worker,
  the same in every elastic restart (``--max_restarts``), so a recipe's
  default run directory stays one directory for the whole job;
* exits non-zero when any worker fails (1), and with 128 + the signal's
  number when the launcher itself is stopped by SIGTERM/SIGINT/... (the
  workers get the signal first; the recipe's workers then checkpoint at the
  next step and exit, see ``fleetlite.callbacks.Preemption``; Ctrl-C is a
  SIGINT, handled the same way, and a second Ctrl-C stops at once);
* checks ``--nproc_per_node`` before starting anything (a positive number, or
  torchrun's ``auto``/``cpu``/``gpu``; at most one process per ``--gpus`` entry),
  and warns when it asks for more processes than this node has GPUs (or, without
  a GPU, CPU cores): such a run thrashes (:func:`oversubscription_warning`);
* is quiet by default: no OMP_NUM_THREADS banner (it still sets 1 thread per
  worker when there are several, as torchrun does), no agent log lines, and
  one line per failed rank, with every traceback and torchrun's full report
  in a log file named on that line. ``FLEETLITE_VERBOSE=1`` (or torchrun's
  ``LOGLEVEL``) brings back torchrun's own output.

Usage::

    fleetlite launch --nproc_per_node 2 train.py --lr 0.1
    python -m fleetlite.distributed.launch --gpus 0,1 train.py
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import MutableMapping

from torch.distributed import DistError
from torch.distributed import run as trun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous.api import RendezvousError

from . import _bootstrap, cluster
from .launch_flags import link_worker_logs, paddle_options, slurm_options
from .rendezvous import reach_master, rendezvous_failure

__all__ = ["main", "split_paddle_options", "resolve_argv", "oversubscription_warning"]

_PADDLE_GPU_OPTS = ("--gpus", "--devices", "--selected_gpus")
#: Seconds since the epoch when ``fleetlite launch`` started; read by recipes (``${launch_time:...}``).
LAUNCH_TIME_VAR = "FLEETLITE_LAUNCH_TIME"
#: ``1``: torchrun's own output (agent logs, full failure report, worker tracebacks on stderr).
VERBOSE_VAR = "FLEETLITE_VERBOSE"
#: The file a quiet launch writes the workers' tracebacks and torchrun's failure report to.
LOG_VAR = "FLEETLITE_LAUNCH_LOG"
_NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")


def verbose(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether the launch shows torchrun's own output (``FLEETLITE_VERBOSE=1`` or a ``LOGLEVEL`` set)."""
    environ = os.environ if environ is None else environ
    return environ.get(VERBOSE_VAR, "").strip().lower() in ("1", "true", "yes") or "LOGLEVEL" in environ


def split_paddle_options(argv: list[str]) -> tuple[list[str], str | None]:
    """Remove Paddle's ``--gpus``/``--selected_gpus`` from the launcher part of ``argv``.

    Only options before the training script are looked at (the script's own
    arguments are never touched). Returns the remaining argv and the GPU list.

    >>> split_paddle_options(["--gpus", "0,1", "train.py", "--gpus", "7"])
    (['train.py', '--gpus', '7'], '0,1')
    """
    out: list[str] = []
    gpus = None
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--" or not tok.startswith("-"):
            out.extend(argv[i:])  # the script (or module / command) and its arguments
            return out, gpus
        name, eq, value = tok.partition("=")
        if name in _PADDLE_GPU_OPTS:
            if not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                    raise SystemExit(f"fleetlite launch: {name} needs a value, e.g. {name} 0,1")
                value = argv[i + 1]
                i += 1
            gpus = value
            i += 1
            continue
        out.append(tok)
        # torchrun options that take a separate value: keep the value with the option
        if not eq and i + 1 < len(argv) and _takes_value(name):
            out.append(argv[i + 1])
            i += 1
        i += 1
    return out, gpus


def _takes_value(option: str) -> bool:
    """Whether torchrun's ``option`` (or an abbreviation argparse accepts) is followed by a value."""
    parser = trun.get_args_parser()
    actions = parser._actions  # argparse has no public lookup by option string
    exact = [a for a in actions if option in a.option_strings]
    matches = exact or [a for a in actions if any(o.startswith(option) for o in a.option_strings)]
    if not matches:
        return True  # unknown: torchrun will reject it with its own message
    return any(a.nargs != 0 for a in matches)


def resolve_argv(argv: list[str], environ: MutableMapping[str, str] | None = None) -> list[str]:
    """torchrun's argv for ``fleetlite launch`` ``argv``: Paddle's options and a SLURM job's nodes applied.

    ``--gpus 0,1`` (or ``--selected_gpus``) sets ``CUDA_VISIBLE_DEVICES`` in
    ``environ`` (default ``os.environ``) and, unless ``--nproc_per_node`` is
    given, one process per listed GPU.

    >>> resolve_argv(["--gpus", "0,1", "train.py"], environ={})
    ['--nproc_per_node', '2', 'train.py']
    """
    return _resolve(argv, environ)[0]


def _resolve(argv: list[str], environ: MutableMapping[str, str] | None = None
             ) -> tuple[list[str], str | None, str | None]:
    """torchrun's argv, Paddle's log directory (or None), and a line saying what SLURM gave (or None)."""
    environ = os.environ if environ is None else environ
    argv, gpus = split_paddle_options(list(argv))
    launcher_part, script_part = _launcher_options(argv)
    launcher_part, log_dir = paddle_options(launcher_part, _takes_value)
    launcher_part, note = slurm_options(launcher_part, environ)
    argv = [*launcher_part, *script_part]
    nproc = _nproc_per_node(launcher_part)
    if gpus is None:
        return argv, log_dir, note
    ids = [g.strip() for g in gpus.split(",") if g.strip()]
    if not ids or not all(g.isdigit() for g in ids):
        raise SystemExit(f"fleetlite launch: --gpus {gpus!r} must be a comma-separated list of GPU "
                         "indices, e.g. --gpus 0,1")
    if nproc is not None and nproc.isdigit() and int(nproc) > len(ids):
        raise SystemExit(f"fleetlite launch: --nproc_per_node {nproc} starts more processes than --gpus {gpus} "
                         f"lists ({len(ids)}); list one GPU per process or lower --nproc_per_node")
    environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    if nproc is None:
        argv = ["--nproc_per_node", str(len(ids)), *argv]
    return argv, log_dir, note


def _nproc_per_node(launcher_part: list[str]) -> str | None:
    """The ``--nproc_per_node`` value among torchrun's options (None when absent); exits on a bad one.

    >>> _nproc_per_node(["--nproc_per_node", "2"])
    '2'
    """
    value = None
    for i, tok in enumerate(launcher_part):
        name, eq, raw = tok.partition("=")
        if name in ("--nproc_per_node", "--nproc-per-node"):
            value = raw if eq else (launcher_part[i + 1] if i + 1 < len(launcher_part) else "")
    if value is None:
        return None
    if value.strip() in _NPROC_WORDS:
        return value.strip()
    if not value.strip().isdigit() or int(value) < 1:
        raise SystemExit(f"fleetlite launch: --nproc_per_node {value!r} must be a positive number of processes "
                         f"per node (or one of {', '.join(_NPROC_WORDS)}), e.g. --nproc_per_node 2")
    return value.strip()


def _launcher_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split argv into torchrun's options and the script with its arguments."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--" or not tok.startswith("-"):
            break
        i += 2 if "=" not in tok and i + 1 < len(argv) and _takes_value(tok) else 1
    return argv[:i], argv[i:]


def _bootstrap_path() -> str:
    return _bootstrap.__file__


def main(argv: list[str] | None = None) -> int:
    """Parse torchrun's arguments, add the bootstrap, and run the workers; returns the exit status."""
    argv, log_dir, note = _resolve(list(sys.argv[1:] if argv is None else argv))
    if note:
        print(f"fleetlite launch: {note}", file=sys.stderr, flush=True)
    args = trun.parse_args(argv)
    if cluster.slurm_job_id(os.environ) and "SIGUSR1" not in (args.signals_to_handle or ""):
        # SLURM's time-limit warning (--signal=USR1@90): passed on to the workers, not the launcher's death
        args.signals_to_handle = ",".join(s for s in ((args.signals_to_handle or ""), "SIGUSR1") if s)
    if not args.training_script:
        raise SystemExit("fleetlite launch: no training script given; usage: fleetlite launch "
                         "[torchrun options] script.py [script args]")
    target = args.training_script
    if not args.no_python:
        if not args.module and not os.path.exists(target):
            raise SystemExit(f"fleetlite launch: training script {target!r} does not exist "
                             f"(looked in {os.getcwd()})")
        args.training_script_args = ["--module" if args.module else "--script", target,
                                     *args.training_script_args]
        args.training_script = _bootstrap_path()
        args.module = False
    try:
        local = trun.determine_local_world_size(args.nproc_per_node)
    except ValueError:
        local = None  # torchrun refuses it itself
    warning = None if local is None else oversubscription_warning(local, _cpu_cores(), _gpu_count())
    if warning:
        print(f"fleetlite launch: warning: {warning}", file=sys.stderr, flush=True)
    loud = verbose()
    saved = {k: os.environ.get(k) for k in (LAUNCH_TIME_VAR, LOG_VAR, "OMP_NUM_THREADS")}
    # one launch time for every worker and every restart (see the module doc); restored for in-process callers
    os.environ[LAUNCH_TIME_VAR] = saved[LAUNCH_TIME_VAR] or f"{time.time():.6f}"
    if not loud:
        _quiet_torchrun(args)
        os.environ.setdefault(LOG_VAR, os.path.join(tempfile.gettempdir(), f"fleetlite-launch-"
                              f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"))
    try:
        unreachable = None if loud else reach_master(args)  # before torch's store retries fill the screen
        if unreachable:
            print(f"fleetlite launch: {unreachable}", file=sys.stderr, flush=True)
            return 1
        trun.run(args)
    except (RendezvousError, DistError) as e:  # before any worker started: the nodes did not meet
        if loud:
            raise
        print(f"fleetlite launch: {rendezvous_failure(e, args)}", file=sys.stderr, flush=True)
        return 1
    except ChildFailedError as e:
        # the workers run through the bootstrap: name the user's script in the summary
        msg = e.format_msg().replace(f"{_bootstrap_path()} FAILED", f"{target} FAILED")
        if loud:
            print(f"fleetlite launch: a worker failed:\n{msg}", file=sys.stderr)
        else:
            log = os.environ[LOG_VAR]
            try:
                with open(log, "a") as f:
                    f.write(msg + "\n")
                where = f"tracebacks and torchrun's report in {log}"
            except OSError as err:
                where = f"could not write the report to {log} ({err}); set FLEETLITE_VERBOSE=1 to see it here"
            first, _ = e.get_first_failure()  # the root cause first, then the ranks that failed because of it
            for rank, failure in sorted(e.failures.items(), key=lambda item: (item[0] != first, item[0])):
                print(f"fleetlite launch: a worker failed: rank {rank} ({target}): {_one_line(failure)} "
                      f"[{where}]", file=sys.stderr)
        return 1
    except SignalException as e:
        sig = signal.Signals(e.sigval)
        grace = args.shutdown_timeout
        if grace is None:
            grace = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
        again = ""
        if sig == signal.SIGINT:
            again = " (a second Ctrl-C stops them at once)"
            if _stop_workers_now():  # this was the second Ctrl-C, which came while torchrun waited for them
                again = "; a second Ctrl-C stopped them at once, without a checkpoint"
        print(f"fleetlite launch: stopped by {sig.name}; the workers got it too and had {grace} s "
              f"(--shutdown_timeout) to finish{again}. A recipe saves a checkpoint at its next step: continue it "
              "with resume=auto", file=sys.stderr)
        return 128 + int(sig)
    except KeyboardInterrupt:
        return 130
    finally:
        if log_dir:
            link_worker_logs(log_dir)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return 0


def oversubscription_warning(nproc: int, cpu_cores: int, gpus: int) -> str | None:
    """The warning for ``nproc`` processes on a node with ``gpus`` GPUs (or, without one, ``cpu_cores`` cores).

    >>> oversubscription_warning(256, cpu_cores=2, gpus=0)[:58]
    '--nproc_per_node 256 starts 256 processes on 2 CPU cores: '
    >>> oversubscription_warning(2, cpu_cores=2, gpus=0) is None
    True
    """
    if gpus > 0 and nproc > gpus:
        return (f"--nproc_per_node {nproc} starts {nproc} processes on {gpus} GPU(s): ranks would share GPUs "
                f"(NCCL refuses that, and gloo runs slowly); use --nproc_per_node {gpus} or fewer")
    if gpus == 0 and nproc > cpu_cores:
        return (f"--nproc_per_node {nproc} starts {nproc} processes on {cpu_cores} CPU cores: every rank gets a "
                f"fraction of a core and the run thrashes (many times slower than {cpu_cores} ranks); use "
                f"--nproc_per_node {cpu_cores} or fewer, unless you only test multi-rank code")
    return None


def _cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity, as taskset or a container sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _children() -> list[int]:
    """Pids of this process's children (Linux; empty elsewhere)."""
    pids: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def _stop_workers_now(grace: float = 5.0) -> bool:
    """Pass a second SIGINT to workers still running (they stop at once), SIGKILL any left after ``grace`` s.

    torchrun gives the workers the first SIGINT and waits for them; a second
    Ctrl-C interrupts that wait and would leave them running. True when any
    worker was still there.
    """
    workers = _children()
    had = bool(workers)
    for pid in workers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while workers and time.monotonic() < deadline:
        workers = [p for p in workers if _reap(p)]
        time.sleep(0.05)
    for pid in workers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return had


def _reap(pid: int) -> bool:
    """True while ``pid`` (a child) is still running."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


def _quiet_torchrun(args: argparse.Namespace) -> None:
    """No OMP_NUM_THREADS banner (set the value torchrun would, silently) and no agent log lines."""
    if "OMP_NUM_THREADS" not in os.environ:
        try:
            several = trun.determine_local_world_size(args.nproc_per_node) > 1
        except ValueError:
            several = False
        if several:
            os.environ["OMP_NUM_THREADS"] = "1"
    # torchrun's loggers were made at import with levels of their own: only failures matter, and those
    # are reported by main() in one line each
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("torch.distributed") and isinstance(logger, logging.Logger):
            logger.setLevel(logging.CRITICAL)


def _one_line(failure: ProcessFailure) -> str:
    """What a failed worker reported (its exception, or the signal that ended it), on one line."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = " ".join(str(message).split())
    if not text or text.startswith("To enable traceback"):
        text = f"exit code {failure.exitcode}"
    if len(text) > 300:  # a long message (a CollectiveError's advice): its first sentence says what happened
        text = text.split(". ")[0]
    return text[:400]

if __name__ == "__main__":
    sys.exit(main())
