"""The ``fleetlite`` command: ``fleetlite launch ...`` and ``fleetlite run RECIPE [overrides]``."""

from __future__ import annotations

import os
import sys

USAGE = """usage: fleetlite <command> [args]

commands:
  launch [torchrun options] SCRIPT [args]   run SCRIPT on several processes (a front over torchrun)
  run RECIPE [hydra overrides]              run a recipe from recipes/ (e.g. fleetlite run cifar10 data=synthetic)
"""


def _recipe_path(name: str) -> str:
    candidates = [name, os.path.join("recipes", name), os.path.join("recipes", name + ".py")]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates.append(os.path.join(here, "recipes", name + ".py"))
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise SystemExit(f"fleetlite run: no recipe named {name!r} (looked for {', '.join(candidates)})")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "launch":
        from .distributed.launch import main as launch_main

        return launch_main(rest)
    if cmd == "run":
        if not rest:
            raise SystemExit("fleetlite run: name a recipe, e.g. fleetlite run cifar10 data=synthetic")
        import runpy

        path = _recipe_path(rest[0])
        sys.argv = [path, *rest[1:]]
        runpy.run_path(path, run_name="__main__")
        return 0
    print(f"fleetlite: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
