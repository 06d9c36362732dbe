"""Worker bootstrap used by ``fleetlite launch``: export Paddle's variables, then run the script.

torchrun starts ``python _bootstrap.py --script SCRIPT ARGS...`` (or ``--module MOD``);
this sets ``PADDLE_TRAINER_ID`` & co. from torchrun's variables and runs the
target as ``__main__`` exactly as ``python SCRIPT ARGS...`` would.
"""

from __future__ import annotations

import os
import runpy
import sys


def export_paddle_env(env=os.environ) -> None:
    """Mirror torchrun's rank variables into Paddle's launch variables."""
    rank = env.get("RANK", "0")
    world = int(env.get("WORLD_SIZE", "1"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    addr = env.get("MASTER_ADDR", "127.0.0.1")
    port = int(env.get("MASTER_PORT", "6170"))
    env.setdefault("PADDLE_TRAINER_ID", rank)
    env.setdefault("PADDLE_TRAINERS_NUM", str(world))
    # Ranks on other nodes are not known to this worker before the group forms; on a single
    # node every endpoint is local and listed (ports are informational, as in Paddle's listing).
    if local_world == world:
        eps = [f"{addr}:{port + 1 + i}" for i in range(world)]
        env.setdefault("PADDLE_TRAINER_ENDPOINTS", ",".join(eps))
        env.setdefault("PADDLE_CURRENT_ENDPOINT", eps[int(rank)])
    if "CUDA_VISIBLE_DEVICES" in env or local_world > 1:
        env.setdefault("FLAGS_selected_gpus", str(local_rank))


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("--script", "--module"):
        raise SystemExit("usage: _bootstrap.py --script SCRIPT [ARGS] | --module MODULE [ARGS]")
    mode, target, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    export_paddle_env()
    if mode == "--module":
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *rest]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
