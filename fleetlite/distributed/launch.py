"""``fleetlite launch``: a thin front over ``torch.distributed.run`` (torchrun).

Every torchrun option works unchanged (``--nproc_per_node``, ``--nnodes``,
``--rdzv_backend``, ``--rdzv_endpoint``, ``--max_restarts``, ``--standalone``,
...). On top of torchrun it:

* accepts Paddle's ``--gpus`` / ``--selected_gpus`` (sets ``CUDA_VISIBLE_DEVICES``
  and, unless given, ``--nproc_per_node``);
* runs each worker through a small bootstrap that also exports Paddle's
  ``PADDLE_TRAINER_ID`` / ``PADDLE_TRAINERS_NUM`` / ``PADDLE_TRAINER_ENDPOINTS`` /
  ``PADDLE_CURRENT_ENDPOINT`` / ``FLAGS_selected_gpus`` so Paddle-style scripts work;
* exports ``FLEETLITE_LAUNCH_TIME`` (when the launch started) to every worker,
  the same in every elastic restart (``--max_restarts``), so a recipe's
  default run directory stays one directory for the whole job;
* exits non-zero when any worker fails (1), and with 128 + the signal's
  number when the launcher itself is stopped by SIGTERM/SIGINT/... (the
  workers get the signal first; the recipe's workers then checkpoint at the
  next step and exit, see ``fleetlite.callbacks.Preemption``).

Usage::

    fleetlite launch --nproc_per_node 2 train.py --lr 0.1
    python -m fleetlite.distributed.launch --gpus 0,1 train.py
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import MutableMapping

__all__ = ["main", "split_paddle_options", "resolve_argv"]

_PADDLE_GPU_OPTS = ("--gpus", "--selected_gpus")
#: Seconds since the epoch when ``fleetlite launch`` started; read by recipes (``${launch_time:...}``).
LAUNCH_TIME_VAR = "FLEETLITE_LAUNCH_TIME"


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
    from torch.distributed import run as trun

    parser = trun.get_args_parser()
    actions = parser._actions  # argparse has no public lookup by option string
    exact = [a for a in actions if option in a.option_strings]
    matches = exact or [a for a in actions if any(o.startswith(option) for o in a.option_strings)]
    if not matches:
        return True  # unknown: torchrun will reject it with its own message
    return any(a.nargs != 0 for a in matches)


def resolve_argv(argv: list[str], environ: MutableMapping[str, str] | None = None) -> list[str]:
    """torchrun's argv for ``fleetlite launch`` ``argv``, with Paddle's GPU options applied.

    ``--gpus 0,1`` (or ``--selected_gpus``) sets ``CUDA_VISIBLE_DEVICES`` in
    ``environ`` (default ``os.environ``) and, unless ``--nproc_per_node`` is
    given, one process per listed GPU.

    >>> resolve_argv(["--gpus", "0,1", "train.py"], environ={})
    ['--nproc_per_node', '2', 'train.py']
    """
    environ = os.environ if environ is None else environ
    argv, gpus = split_paddle_options(list(argv))
    if gpus is None:
        return argv
    ids = [g.strip() for g in gpus.split(",") if g.strip()]
    if not ids or not all(g.isdigit() for g in ids):
        raise SystemExit(f"fleetlite launch: --gpus {gpus!r} must be a comma-separated list of GPU "
                         "indices, e.g. --gpus 0,1")
    environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    launcher_part, _ = _launcher_options(argv)
    if not any(a.split("=")[0] in ("--nproc_per_node", "--nproc-per-node") for a in launcher_part):
        argv = ["--nproc_per_node", str(len(ids)), *argv]
    return argv


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
    from . import _bootstrap

    return _bootstrap.__file__


def main(argv: list[str] | None = None) -> int:
    """Parse torchrun's arguments, add the bootstrap, and run the workers; returns the exit status."""
    from torch.distributed import run as trun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    argv = resolve_argv(list(sys.argv[1:] if argv is None else argv))
    args = trun.parse_args(argv)
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
    from torch.distributed.elastic.multiprocessing.api import SignalException

    # one launch time for every worker and every restart (see the module doc); restored for in-process callers
    previous = os.environ.get(LAUNCH_TIME_VAR)
    os.environ[LAUNCH_TIME_VAR] = previous or f"{time.time():.6f}"
    try:
        trun.run(args)
    except ChildFailedError as e:
        # the workers run through the bootstrap: name the user's script in the summary
        msg = e.format_msg().replace(f"{_bootstrap_path()} FAILED", f"{target} FAILED")
        print(f"fleetlite launch: a worker failed:\n{msg}", file=sys.stderr)
        return 1
    except SignalException as e:
        sig = signal.Signals(e.sigval)
        grace = args.shutdown_timeout
        if grace is None:
            grace = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
        print(f"fleetlite launch: stopped by {sig.name}; the workers got it too and had {grace} s "
              "(--shutdown_timeout) to finish. A recipe saves a checkpoint at its next step: continue it with "
              "resume=auto", file=sys.stderr)
        return 128 + int(sig)
    except KeyboardInterrupt:
        return 130
    finally:
        if previous is None:
            os.environ.pop(LAUNCH_TIME_VAR, None)
        else:
            os.environ[LAUNCH_TIME_VAR] = previous
    return 0


if __name__ == "__main__":
    sys.exit(main())
