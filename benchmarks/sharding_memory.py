"""Sharding stages against torch DDP: per-rank state bytes, peak RSS, step time; async vs sync checkpoint stall.

2 ranks on gloo, one thread each, a ~25M-parameter MLP (6 x Linear(2048, 2048)) trained with AdamW. Each
configuration runs in a fresh pair of processes (so peak RSS is its own): torch DDP, stage 1
(ZeroRedundancyOptimizer), stage 2 and 3 (FSDP2) and stage 3 with CPU offload. "State bytes" are counted
from the tensors each rank holds: its parameters (local shards), gradients and optimizer state. Step time is
the median over the timed steps. In the stage-3 and DDP processes the same state is also checkpointed with
torch DCP synchronously and asynchronously (fleetlite.checkpoint.save), alternating, --saves times each: the
training stall is the median time the call blocks.

    python benchmarks/sharding_memory.py [--steps 6] [--repeats 1] [--batch 64] [--saves 3] [--configs ddp,stage3]

Prints a table of ratios to DDP and writes benchmarks/results/sharding_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetlite.testing import run_ranks  # noqa: E402
from fleetlite.utils.atomic import atomic_write_text  # noqa: E402

CONFIGS = ["ddp", "stage1", "stage2", "stage3", "stage3_offload"]
WIDTH, DEPTH = 2048, 6


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if torch.is_tensor(t))


def _opt_tensors(opt):
    inner = getattr(opt, "inner_opt", opt)
    inner = getattr(inner, "optim", inner)  # ZeroRedundancyOptimizer's local optimizer
    return [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v)]


def _rank(rank, world, config, steps, ckpt_root, batch, saves):
    import torch.nn.functional as F

    import fleetlite.checkpoint as ckpt
    from fleetlite.distributed import fleet
    from fleetlite.distributed.fleet import fleet as fleet_impl

    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
    if config == "ddp":
        model = nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        stage = int(config[5])
        fleet_impl._reset()
        fleet.init(is_collective=True, strategy=fleet.DistributedStrategy(
            sharding=True, sharding_configs={"stage": stage, "offload": config.endswith("offload")}))
        model = fleet.distributed_model(net)
        opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4))
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, WIDTH, generator=g), torch.randn(batch, WIDTH, generator=g)
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if i < steps + 1:
            opt.zero_grad()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    params = list(model.parameters())
    state = {"params": _bytes(params), "grads": _bytes([p.grad for p in params if p.grad is not None]),
             "optim": _bytes(_opt_tensors(opt))}
    out = {"step_s": statistics.median(times), "state": state, "state_bytes": sum(state.values()),
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if config in ("ddp", "stage3"):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        module = model.module
        inner = getattr(opt, "inner_opt", opt)
        stalls = {"sync": [], "async": []}
        for i in range(saves):  # alternating, so machine load hits both modes alike
            for mode in ("sync", "async"):
                msd, osd = get_state_dict(module, inner)
                t0 = time.perf_counter()
                pending = ckpt.save({"model": msd, "optim": osd}, os.path.join(ckpt_root, f"{config}-{mode}-{i}"),
                                    async_save=mode == "async")
                stalls[mode].append(time.perf_counter() - t0)
                F.mse_loss(model(x), y).backward()  # training goes on while an async save writes
                opt.step()
                opt.zero_grad()
                pending.wait()
        out["save_stall_s"] = {m: statistics.median(v) for m, v in stalls.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    ap.add_argument("--saves", type=int, default=3, help="checkpoints per mode (sync/async); the median stall")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated subset of " + ",".join(CONFIGS) + " (ddp is always run: the ratios need it)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "sharding_memory.json"))
    args = ap.parse_args()
    wanted = set(args.configs.split(",")) | {"ddp"}
    unknown = wanted - set(CONFIGS)
    if unknown:
        ap.error(f"unknown config(s) {sorted(unknown)}; choose from {CONFIGS}")
    runs: dict[str, list] = {c: [] for c in CONFIGS if c in wanted}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.repeats):
            for config in runs:  # interleaved, so machine load hits every configuration alike
                rank_args = (config, args.steps, root, args.batch, args.saves)
                runs[config].append(run_ranks(_rank, args=rank_args, timeout=900))
    rows = {}
    for config, reps in runs.items():
        ranks = [r for rep in reps for r in rep]
        rows[config] = {
            "state_bytes_per_rank": max(r["state_bytes"] for r in ranks),
            "state_breakdown_rank0": ranks[0]["state"],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),
            "step_s": statistics.median(r["step_s"] for r in ranks),
        }
        if "save_stall_s" in ranks[0]:
            rows[config]["save_stall_s"] = {m: statistics.median(r["save_stall_s"][m] for r in ranks)
                                            for m in ("sync", "async")}
    ddp = rows["ddp"]
    print(f"{'config':16} {'state MB/rank':>13} {'x DDP':>6} {'peak RSS MB':>11} {'x DDP':>6} {'step s':>7} "
          f"{'x DDP':>6}")
    for config, r in rows.items():
        r["state_ratio"] = r["state_bytes_per_rank"] / ddp["state_bytes_per_rank"]
        r["rss_ratio"] = r["peak_rss_mb"] / ddp["peak_rss_mb"]
        r["step_ratio"] = r["step_s"] / ddp["step_s"]
        print(f"{config:16} {r['state_bytes_per_rank'] / 2**20:13.1f} {r['state_ratio']:6.2f} "
              f"{r['peak_rss_mb']:11.0f} {r['rss_ratio']:6.2f} {r['step_s']:7.3f} {r['step_ratio']:6.2f}")
    for config in (c for c in ("ddp", "stage3") if c in rows):
        s = rows[config]["save_stall_s"]
        s["async_over_sync"] = s["async"] / s["sync"]
        print(f"checkpoint stall ({config}): sync {s['sync']:.3f} s, async {s['async']:.3f} s "
              f"({s['async_over_sync']:.2f}x)")
    params = WIDTH * WIDTH * DEPTH + WIDTH * DEPTH
    model = f"{DEPTH} x Linear({WIDTH}, {WIDTH}), {params / 1e6:.1f}M parameters, AdamW"
    out = {"model": model, "batch_per_rank": args.batch,
           "world_size": 2, "backend": "gloo (CPU, 1 thread per rank)", "steps": args.steps, "saves": args.saves,
           "repeats": args.repeats, "torch": torch.__version__, "machine": platform.platform(),
           "cpu_count": os.cpu_count(), "load_average_1_5_15min": [round(v, 2) for v in os.getloadavg()],
           "results": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    atomic_write_text(args.out, json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
