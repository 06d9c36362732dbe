"""The ``fleetlite`` command: ``launch``, and torchtune-style ``run`` / ``ls`` / ``cp`` for the shipped recipes."""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

from .recipe.catalog import CatalogError, config_groups, config_names, copy_out, find_recipe, recipe_names

USAGE = """usage: fleetlite <command> [args]

commands:
  launch [torchrun options] SCRIPT [args]   run SCRIPT on several processes (a front over torchrun)
  run [torchrun options] RECIPE [overrides] run a recipe by name (e.g. fleetlite run cifar10 data=synthetic);
                                            with torchrun options (fleetlite run --nproc_per_node 2 cifar10 ...)
                                            through fleetlite launch; --config FILE.yaml runs a copied config
  ls                                        the recipes and their configs
  cp [--force] NAME DEST                    copy a recipe (cifar10) or config (cifar10.yaml, optim/sgd.yaml) out
                                            to edit; an existing DEST is kept unless --force
"""


def _split_config(args: list[str]) -> list[str]:
    """``--config PATH.yaml`` (or ``--config=PATH``) as Hydra's ``--config-dir DIR --config-name NAME``."""
    out, i = [], 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name != "--config":
            out.append(args[i])
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args):
                raise SystemExit("fleetlite run: --config needs a file, e.g. --config ./my.yaml")
            value, i = args[i + 1], i + 1
        i += 1
        path = Path(value)
        if not path.is_file():
            raise SystemExit(f"fleetlite run: --config {value}: no such file (copy one out with "
                             "fleetlite cp cifar10.yaml ./my.yaml)")
        out += ["--config-dir", str(path.resolve().parent), "--config-name", path.stem]
    return out


def run_usage() -> str:
    """``fleetlite run --help``: the command's shape and the shipped recipes."""
    return ("usage: fleetlite run [torchrun options] RECIPE [overrides]\n\n"
            f"recipes: {', '.join(recipe_names())} (or the path of a recipe .py file, e.g. one fleetlite cp wrote)\n"
            "  fleetlite run RECIPE --help          the recipe's config groups and options\n"
            "  fleetlite run cifar10 data=synthetic trainer.epochs=1\n"
            "  fleetlite run --nproc_per_node 2 gpt hybrid=mp2\n"
            "fleetlite ls lists every recipe with its configs.")


def run(argv: list[str]) -> int:
    """``fleetlite run [torchrun options] RECIPE [overrides]``: in this process, or through ``fleetlite launch``."""
    if argv[:1] in (["-h"], ["--help"]):
        print(run_usage())
        return 0
    # local: fleetlite.distributed imports torch (seconds), which fleetlite ls/cp/--help do not need
    from .distributed.launch import _launcher_options  # torchrun's own option table: which options take a value
    from .distributed.launch import main as launch_main

    launcher, rest = _launcher_options(argv)
    if not rest or rest[0] == "--":
        print(f"fleetlite run: name a recipe ({', '.join(recipe_names())}), e.g. fleetlite run cifar10 "
              "data=synthetic (fleetlite run --help)", file=sys.stderr)
        return 2
    try:
        path = str(find_recipe(rest[0]))
    except CatalogError as e:
        raise SystemExit(f"fleetlite run: {e}") from None
    script_args = _split_config(rest[1:])
    if launcher:  # torchrun's options: the recipe runs on the processes fleetlite launch starts
        error = _check_before_launch(path, launcher, script_args)
        if error:  # one line and exit 2, as in one process, instead of one "a worker failed" line per rank
            print(f"error: {' '.join(error.split())}", file=sys.stderr)
            return 2
        return launch_main([*launcher, path, *script_args])
    sys.argv = [path, *script_args]
    runpy.run_path(path, run_name="__main__")
    return 0


def _world_size(launcher: list[str]) -> int | None:
    """The number of ranks torchrun's ``launcher`` options start (None when elastic: ``--nnodes 1:4``)."""
    from torch.distributed import run as trun  # local: see run()

    from .distributed.launch import resolve_argv

    args = trun.parse_args(resolve_argv([*launcher, "recipe.py"], environ={}))
    low, _, high = str(args.nnodes).partition(":")
    if high and high != low:
        return None
    try:
        return int(low) * trun.determine_local_world_size(args.nproc_per_node)
    except ValueError:
        return None  # torchrun refuses it itself, with its own message


def _check_before_launch(path: str, launcher: list[str], script_args: list[str]) -> str | None:
    """The recipe's config checks, made once here before torchrun starts the workers (the config is known here).

    Returns the one-line error, or None. The recipe is loaded (not run) to learn its config folder and name.
    """
    from .distributed.launch import LAUNCH_TIME_VAR
    from .recipe.job import check_command_line

    world = _world_size(launcher)
    command = next((v for v in runpy.run_path(path, run_name="fleetlite_recipe_check").values()
                    if hasattr(v, "recipe_config")), None)
    if world is None or command is None:
        return None  # the workers check it
    os.environ.setdefault(LAUNCH_TIME_VAR, f"{time.time():.6f}")  # the run_dir the workers resolve (launch keeps it)
    return check_command_line(*command.recipe_config, script_args, world_size=world)


def ls() -> int:
    """``fleetlite ls``: each recipe with its primary config, then the config groups' options."""
    print(f"{'RECIPE':<12} CONFIG")
    for name in recipe_names():
        configs = config_names(name)
        print(f"{name:<12} {configs[0] if configs else '-'}")
        for group, options in config_groups(name).items():
            print(f"{'':<12}   {group}/: {', '.join(options)}")
    return 0


def cp(argv: list[str]) -> int:
    """``fleetlite cp [--force] NAME DEST``."""
    if argv[:1] in (["-h"], ["--help"]):
        print("usage: fleetlite cp [--force] NAME DEST\n\ncopy a recipe (e.g. fleetlite cp cifar10 ./my_recipe.py, "
              "then fleetlite run ./my_recipe.py) or a config (fleetlite cp cifar10.yaml ./my.yaml, then fleetlite "
              "run cifar10 --config ./my.yaml) out to edit; fleetlite ls lists the names")
        return 0
    force = "--force" in argv or "-f" in argv
    args = [a for a in argv if a not in ("--force", "-f")]
    if len(args) != 2:
        raise SystemExit("fleetlite cp: usage: fleetlite cp [--force] NAME DEST, e.g. fleetlite cp cifar10 "
                         "./my_recipe.py or fleetlite cp cifar10.yaml ./my.yaml")
    try:
        out = copy_out(args[0], args[1], force=force)
    except CatalogError as e:
        raise SystemExit(f"fleetlite cp: {e}") from None
    how = f"fleetlite run {out}" if out.suffix == ".py" else f"fleetlite run RECIPE --config {out}"
    print(f"copied {args[0]} to {out} (run it with {how})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "launch":
        from .distributed.launch import main as launch_main  # local: torch only for the commands that run

        return launch_main(rest)
    if cmd == "run":
        return run(rest)
    if cmd == "ls":
        return ls()
    if cmd == "cp":
        return cp(rest)
    print(f"fleetlite: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
