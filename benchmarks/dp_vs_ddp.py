"""fleetlite.DataParallel against torch DistributedDataParallel: step time and peak memory.

2 ranks on gloo, one thread each. For each model both engines live in the same
two processes (same init, same data) and are timed alternately in blocks, so
machine noise hits both alike; the compute-only step (no all-reduce) is timed
too. Peak RSS is measured per engine in fresh pairs of processes (median of 3).

    python benchmarks/dp_vs_ddp.py [--blocks 6] [--steps 5] [--models conv,mlp,big,convcl,big:fp16]

``convcl`` is the conv net in ``channels_last`` memory format (gradients keep
the parameters' strides on both engines); a ``:fp16`` suffix registers torch's
``fp16_compress_hook`` on both engines.

Prints a table and writes benchmarks/results/dp_vs_ddp.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fleetlite  # noqa: E402
from fleetlite.testing import run_ranks  # noqa: E402
from fleetlite.utils.atomic import atomic_write_text  # noqa: E402


class ConvNet(nn.Module):
    """About 1.1M parameters."""

    def __init__(self):
        super().__init__()
        chans = [3, 64, 128, 256, 256]
        layers = []
        for a, b in zip(chans, chans[1:]):
            layers += [nn.Conv2d(a, b, 3, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(256 * 2 * 2, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.head(self.features(x))


def build(name: str):
    if name == "conv":
        return ConvNet(), (32, 3, 32, 32)
    if name == "convcl":
        return ConvNet().to(memory_format=torch.channels_last), (32, 3, 32, 32)
    if name == "mlp":
        return nn.Sequential(*[nn.Linear(128, 128) for _ in range(60)]), (16, 128)
    if name == "big":
        return nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(6)]), (16, 2048)
    raise ValueError(name)


def make(name: str, engine: str, rank: int):
    """(wrapped model, optimizer, input) for ``name`` (``model[:fp16]``) on ``engine``."""
    arch, _, hook = name.partition(":")
    torch.manual_seed(0)
    base, shape = build(arch)
    m = fleetlite.DataParallel(base) if engine == "ours" else DDP(base)
    if hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        m.register_comm_hook(None, default_hooks.fp16_compress_hook)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(rank))
    if arch == "convcl":
        x = x.to(memory_format=torch.channels_last)
    return m, torch.optim.SGD(m.parameters(), lr=1e-4), x


def _step(model, opt, x):
    opt.zero_grad()
    model(x).float().pow(2).mean().backward()
    opt.step()


def _time_block(model, opt, x, steps, no_sync=False):
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        if no_sync:
            with model.no_sync():
                _step(model, opt, x)
        else:
            _step(model, opt, x)
        times.append(time.perf_counter() - t0)
    return times


def timing_worker(rank, world, name, blocks, steps):
    m_ours, o_ours, x = make(name, "ours", rank)
    m_ddp, o_ddp, _ = make(name, "ddp", rank)
    params = sum(p.numel() for p in m_ours.parameters())
    for m, o in ((m_ours, o_ours), (m_ddp, o_ddp)):
        _time_block(m, o, x, 3)
    res = {"ours": [], "ddp": [], "compute": []}
    for b in range(blocks):
        order = [("ours", m_ours, o_ours), ("ddp", m_ddp, o_ddp)]
        if b % 2:
            order.reverse()
        for key, m, o in order:
            res[key] += _time_block(m, o, x, steps)
        res["compute"] += _time_block(m_ours, o_ours, x, max(2, steps // 2), no_sync=True)
    return {"params": params, **res}


def memory_worker(rank, world, name, engine, steps):
    m, opt, x = make(name, engine, rank)
    for _ in range(steps):
        _step(m, opt, x)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # MiB


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--models", default="conv,mlp,big,convcl,big:fp16")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "dp_vs_ddp.json"))
    args = ap.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        t = run_ranks(timing_worker, args=(name, args.blocks, args.steps), timeout=1800)
        med = {k: max(statistics.median(r[k]) for r in t) * 1e3 for k in ("ours", "ddp", "compute")}
        # peak RSS varies from run to run (allocator timing): median of 3 fresh runs per engine, alternating
        runs = {"ours": [], "ddp": []}
        for _ in range(3):
            for e in runs:
                runs[e].append(max(run_ranks(memory_worker, args=(name, e, 5), timeout=600)))
        mem = {e: statistics.median(v) for e, v in runs.items()}
        rows.append({
            "model": name, "params": t[0]["params"], "fleetlite_ms": med["ours"], "ddp_ms": med["ddp"],
            "ratio": med["ours"] / med["ddp"], "no_sync_ms": med["compute"],
            "fleetlite_peak_rss_mib": mem["ours"], "ddp_peak_rss_mib": mem["ddp"],
            "rss_ratio": mem["ours"] / mem["ddp"],
        })
        r = rows[-1]
        print(f"{name}: {r['fleetlite_ms']:.1f} ms vs DDP {r['ddp_ms']:.1f} ms", flush=True)
    header = (f"{'model':9} {'params':>10} {'fleetlite ms':>13} {'DDP ms':>9} {'ratio':>6} {'no-sync ms':>11} "
              f"{'RSS MiB (ours/DDP)':>20} {'RSS ratio':>9}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['model']:9} {r['params']:>10,} {r['fleetlite_ms']:>13.1f} {r['ddp_ms']:>9.1f} {r['ratio']:>6.3f} "
              f"{r['no_sync_ms']:>11.1f} {r['fleetlite_peak_rss_mib']:>9.0f}/{r['ddp_peak_rss_mib']:<10.0f} "
              f"{r['rss_ratio']:>9.3f}")
    out = {"benchmark": "dp_vs_ddp", "world_size": 2, "backend": "gloo", "threads_per_rank": 1,
           "torch": torch.__version__, "machine": f"{platform.machine()} {os.cpu_count()} cores",
           "blocks": args.blocks, "steps_per_block": args.steps, "rows": rows}
    atomic_write_text(args.out, json.dumps(out, indent=2))
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
