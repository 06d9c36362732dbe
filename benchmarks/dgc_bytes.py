"""strategy.dgc against dense data parallel: bytes each rank sends per step, and the ratio.

2 ranks on gloo, one thread each, an MLP of about 1.3M parameters (every
weight matrix over Paddle's 16384-element threshold is compressed, biases and
small tensors stay dense). The dense peer is fleetlite.DataParallel with torch's
``allreduce_hook`` wrapped to count the bytes it all-reduces; the DGC run is
``fleet.distributed_optimizer`` with ``strategy.dgc`` (its hook counts the bytes
it all-gathers: values plus int32 indices, and the dense small tensors). The
sparsity ramps through the DGC paper's schedule, two steps per level; each row
is one level. ``compressed ratio`` is the compressed tensors' share of the bytes
against their dense size, ``2 (1 - sparsity)`` by construction (a value and an
index per kept element).

    python benchmarks/dgc_bytes.py [--begin 2]

Prints a table and writes benchmarks/results/dgc_bytes.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fleetlite  # noqa: E402
import fleetlite.distributed.fleet as fleet  # noqa: E402
from fleetlite.distributed.fleet import fleet as fleet_impl  # noqa: E402
from fleetlite.testing import run_ranks  # noqa: E402
from fleetlite.utils.atomic import atomic_write_text  # noqa: E402

SPARSITY = [0.75, 0.9375, 0.984375, 0.996, 0.999]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def worker(rank: int, world: int, begin: int) -> dict:
    torch.set_num_threads(1)
    steps = begin + 2 * len(SPARSITY)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(rank + 7))

    dense_bytes: list[int] = []

    def counting_allreduce(state, bucket):
        dense_bytes[-1] += bucket.buffer().numel() * bucket.buffer().element_size()
        return default_hooks.allreduce_hook(state, bucket)

    dense = fleetlite.DataParallel(make_model())
    dense.register_comm_hook(None, counting_allreduce)
    dense_opt = torch.optim.SGD(dense.parameters(), lr=0.01, momentum=0.9)
    for _ in range(steps):
        dense_bytes.append(0)
        dense_opt.zero_grad()
        F.cross_entropy(dense(x), y).backward()
        dense_opt.step()

    fleet_impl._reset()
    strategy = fleet.DistributedStrategy(dgc=True, dgc_configs={"rampup_begin_step": begin, "rampup_step":
                                                                 2 * len(SPARSITY), "sparsity": SPARSITY})
    fleet.init(is_collective=True, strategy=strategy)
    model = fleet.distributed_model(make_model())
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    state = opt.meta.dgc_state
    for _ in range(steps):
        opt.clear_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    small = sum(p.numel() for p in model.parameters() if not state.compresses(p))
    big = sum(p.numel() for p in model.parameters() if state.compresses(p))
    return {"dense": dense_bytes, "dgc": list(state.bytes_per_step), "small": small, "big": big}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--begin", type=int, default=2, help="rampup_begin_step (dense steps first)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "dgc_bytes.json"))
    args = ap.parse_args(argv)
    res = run_ranks(worker, args=(args.begin,), timeout=900)[0]
    rows = [{"phase": f"dense (step < {args.begin})", "sparsity": 0.0, "dense_bytes": res["dense"][0],
             "dgc_bytes": res["dgc"][0], "ratio": res["dgc"][0] / res["dense"][0], "compressed_ratio": 1.0}]
    for i, s in enumerate(SPARSITY):
        step = args.begin + 2 * i
        d, c = res["dense"][step], res["dgc"][step]
        rows.append({"phase": f"step {step}", "sparsity": s, "dense_bytes": d, "dgc_bytes": c, "ratio": c / d,
                     "compressed_ratio": (c - 4 * res["small"]) / (4 * res["big"])})
    header = (f"{'phase':16} {'sparsity':>9} {'dense B/step':>13} {'DGC B/step':>11} {'ratio':>7} "
              f"{'compressed ratio':>17} {'2(1-s)':>7}")
    print(f"params: {res['big'] + res['small']:,} ({res['big']:,} compressed, {res['small']:,} dense), 2 ranks, gloo")
    print(header)
    print("-" * len(header))
    for r in rows:
        expected = f"{2 * (1 - r['sparsity']):.4f}" if r["sparsity"] else "-"
        print(f"{r['phase']:16} {r['sparsity']:>9.6g} {r['dense_bytes']:>13,} {r['dgc_bytes']:>11,} {r['ratio']:>7.4f} "
              f"{r['compressed_ratio']:>17.4f} {expected:>7}")
    out = {"benchmark": "dgc_bytes", "world_size": 2, "backend": "gloo", "torch": torch.__version__,
           "machine": f"{platform.machine()} {os.cpu_count()} cores", "params_compressed": res["big"],
           "params_dense": res["small"], "rows": rows}
    atomic_write_text(args.out, json.dumps(out, indent=2))
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
