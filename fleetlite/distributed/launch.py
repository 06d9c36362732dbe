"""``fleetlite launch``: a thin front over ``torch.distributed.run`` (torchrun).

Every torchrun option works unchanged (``--nproc_per_node``, ``--nnodes``,
``--rdzv_backend``, ``--rdzv_endpoint``, ``--max_restarts``, ``--standalone``,
...). On top of torchrun it:

* accepts Paddle's ``--gpus`` / ``--selected_gpus`` (sets ``CUDA_VISIBLE_DEVICES``
  and, unless given, ``--nproc_per_node``);
* runs each worker through a small bootstrap that also exports Paddle's
  ``PADDLE_TRAINER_ID`` / ``PADDLE_TRAINERS_NUM`` / ``PADDLE_TRAINER_ENDPOINTS`` /
  ``PADDLE_CURRENT_ENDPOINT`` / ``FLAGS_selected_gpus`` so Paddle-style scripts work;
* exits non-zero when any worker fails.

Usage::

    fleetlite launch --nproc_per_node 2 train.py --lr 0.1
    python -m fleetlite.distributed.launch --gpus 0,1 train.py
"""

from __future__ import annotations

import os
import sys

__all__ = ["main", "split_paddle_options"]

_PADDLE_GPU_OPTS = ("--gpus", "--selected_gpus")


def split_paddle_options(argv: list[str]) -> tuple[list[str], str | None]:
    """Remove Paddle's ``--gpus``/``--selected_gpus`` from the launcher part of ``argv``.

    Only options before the training script are looked at (the script's own
    arguments are never touched). Returns the remaining argv and the GPU list.
    """
    out: list[str] = []
    gpus = None
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("-") or tok in ("-m", "--module", "--no-python", "--no_python"):
            out.extend(argv[i:])  # the script (or -m/--no-python and their target) and its arguments
            return out, gpus
        name, eq, value = tok.partition("=")
        if name in _PADDLE_GPU_OPTS:
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"fleetlite launch: {name} needs a value, e.g. {name} 0,1")
                value = argv[i + 1]
                i += 1
            gpus = value
            i += 1
            continue
        out.append(tok)
        # torchrun options that take a separate value: keep the value with the option
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-") and _takes_value(name):
            out.append(argv[i + 1])
            i += 1
        i += 1
    return out, gpus


def _takes_value(option: str) -> bool:
    from torch.distributed import run as trun

    parser = trun.get_args_parser()
    for action in parser._actions:  # argparse has no public lookup by option string
        if option in action.option_strings:
            return action.nargs != 0
    return True


def _bootstrap_path() -> str:
    from . import _bootstrap

    return _bootstrap.__file__


def main(argv: list[str] | None = None) -> int:
    """Parse torchrun's arguments, add the bootstrap, and run the workers."""
    from torch.distributed import run as trun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    argv = list(sys.argv[1:] if argv is None else argv)
    argv, gpus = split_paddle_options(argv)
    if gpus is not None:
        ids = [g.strip() for g in gpus.split(",") if g.strip()]
        if not ids or not all(g.isdigit() for g in ids):
            raise SystemExit(f"fleetlite launch: --gpus {gpus!r} must be a comma-separated list of GPU "
                             "indices, e.g. --gpus 0,1")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        if not any(a.split("=")[0] in ("--nproc_per_node", "--nproc-per-node") for a in argv):
            argv = ["--nproc_per_node", str(len(ids)), *argv]
    args = trun.parse_args(argv)
    if not args.training_script:
        raise SystemExit("fleetlite launch: no training script given; usage: fleetlite launch "
                         "[torchrun options] script.py [script args]")
    if not args.no_python:
        target = args.training_script
        if not args.module and not os.path.exists(target):
            raise SystemExit(f"fleetlite launch: training script {target!r} does not exist "
                             f"(looked in {os.getcwd()})")
        args.training_script_args = ["--module" if args.module else "--script", target,
                                     *args.training_script_args]
        args.training_script = _bootstrap_path()
        args.module = False
    try:
        trun.run(args)
    except ChildFailedError as e:
        print(f"fleetlite launch: a worker failed:\n{e.format_msg()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
