"""Cost of the peer monitor (Note [peer monitor]) on a training step: 2 ranks, gloo, one thread each.

The monitor runs on NCCL groups; here it is forced on a gloo group (``FLEETLITE_PEER_MONITOR=1`` semantics)
and switched on and off in alternate blocks inside the same two processes, so machine noise hits both alike.
The step is a small MLP under fleetlite.DataParallel (a few ms: the monitor's store calls every 0.5 s are
the most visible there).

    python benchmarks/peer_monitor_overhead.py [--blocks 8] [--steps 60]

Prints the median step time with and without the monitor and writes benchmarks/results/peer_monitor_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fleetlite  # noqa: E402
from fleetlite.testing import run_ranks  # noqa: E402
from fleetlite.utils.atomic import atomic_write_text  # noqa: E402


def _blocks(rank, world, blocks, steps):
    from fleetlite.distributed import monitor

    torch.manual_seed(0)
    model = fleetlite.DataParallel(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def block():
        start = time.perf_counter()
        for _ in range(steps):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        return (time.perf_counter() - start) / steps

    block()  # warm-up
    times = {"off": [], "on": []}
    for i in range(blocks):
        for kind in (("on", "off") if i % 2 else ("off", "on")):
            if kind == "on":
                os.environ["FLEETLITE_PEER_MONITOR"] = "1"
                assert monitor.start_monitor(nccl=False) is not None
            times[kind].append(block())
            if kind == "on":
                monitor.stop_monitor(clean=False)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)
    per_rank = run_ranks(_blocks, world_size=2, args=(args.blocks, args.steps), timeout=600)
    # a step ends when the slower rank ends it: per block, the max over ranks
    off = [max(r["off"][i] for r in per_rank) for i in range(args.blocks)]
    on = [max(r["on"][i] for r in per_rank) for i in range(args.blocks)]
    result = {"torch": torch.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
              "blocks": args.blocks, "steps_per_block": args.steps,
              "step_ms_monitor_off": 1000 * statistics.median(off), "step_ms_monitor_on": 1000 * statistics.median(on),
              "on_vs_off": statistics.median(on) / statistics.median(off)}
    print(f"{'monitor':10} {'median step (ms)':>18}")
    print(f"{'off':10} {result['step_ms_monitor_off']:18.3f}")
    print(f"{'on':10} {result['step_ms_monitor_on']:18.3f}")
    print(f"on / off: {result['on_vs_off']:.3f}")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "peer_monitor_overhead.json")
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
