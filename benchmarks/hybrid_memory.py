"""Hybrid parallel memory on the GPT recipe's model: parameter + AdamW bytes per rank, peak RSS, step time.

4 ranks on gloo, one thread each, the recipe's GPT (fleetlite.text.gpt) widened to --width 512 (4 layers, 8
heads, byte vocabulary 256) so the weights dominate. Configurations, each in a fresh set of 4 processes (so
peak RSS is its own): dp=4 (the peer: plain data parallel), mp=2 x dp=2, pp=2 x dp=2, mp=4. "Parameter bytes"
and "optimizer bytes" are counted from the tensors each rank holds (its slices / its stage; AdamW's exp_avg
and exp_avg_sq); the largest rank is reported. Step time is the median over the timed steps of one optimizer
step on the same global batch. Goal: mp=2 halves the parameter bytes per rank (within 5%).

    python benchmarks/hybrid_memory.py [--steps 4] [--width 512] [--layers 4] [--batch 8] [--seq 64]

Prints a table of ratios to dp=4 and writes benchmarks/results/hybrid_memory.json.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetlite.testing import run_ranks  # noqa: E402
from fleetlite.utils.atomic import atomic_write_text  # noqa: E402

CONFIGS = {"dp4": (4, 1, 1), "dp2_mp2": (2, 2, 1), "dp2_pp2": (2, 1, 2), "mp4": (1, 4, 1)}  # (dp, mp, pp)


def _bytes(tensors) -> int:
    """The bytes the tensors' storages hold, each storage once: a slice that viewed the full weight would count
    the full weight (what the process really keeps), not its own elements."""
    storages = {}
    for t in tensors:
        if torch.is_tensor(t):
            s = t.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def _rank(rank, world, degrees, steps, width, layers, batch, seq):
    from fleetlite.distributed import fleet
    from fleetlite.distributed.fleet.meta_parallel import PipelineLayer
    from fleetlite.text.corpus import batch_of_windows, encode, synthetic_corpus
    from fleetlite.text.gpt import GPT, GPTConfig, gpt_loss, gpt_pipeline_descs

    torch.set_num_threads(1)
    dp, mp, pp = degrees
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": dp, "mp_degree": mp, "pp_degree": pp}
    rows = batch // dp
    strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": max(rows // 2, 1)}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    cfg = GPTConfig(width=width, layers=layers, heads=8, seq_len=seq)
    layer = PipelineLayer(gpt_pipeline_descs(cfg), topology=hcg.topology(), loss_fn=gpt_loss) if pp > 1 \
        else GPT(cfg)
    model = fleet.distributed_model(layer)
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    ids = encode(synthetic_corpus(50_000))
    r = hcg.get_data_parallel_rank()
    times = []
    for step in range(steps + 1):  # the first step (state allocation, warm-up) is not timed
        x, y = batch_of_windows(ids, batch, seq, 0, step)
        x, y = x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows]
        torch.distributed.barrier()
        start = time.perf_counter()
        if pp > 1:
            model.train_batch([x, y], opt)
        else:
            model(x, y).backward()
            opt.step()
            opt.clear_grad()
        torch.distributed.barrier()
        if step:
            times.append(time.perf_counter() - start)
    inner = getattr(opt, "inner_opt", opt)
    state = [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    return {"param_bytes": _bytes(layer.parameters()), "optim_bytes": _bytes(state),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_s": statistics.median(times)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--configs", default=",".join(CONFIGS))
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = {}
    for name in args.configs.split(","):
        per_rank = run_ranks(_rank, world_size=4, timeout=900,
                             args=(CONFIGS[name], args.steps, args.width, args.layers, args.batch, args.seq))
        results[name] = {k: max(r[k] for r in per_rank) for k in per_rank[0]}
        results[name]["param_bytes_per_rank"] = [r["param_bytes"] for r in per_rank]
        print(f"{name}: {results[name]}", flush=True)
    base = results.get("dp4")
    print(f"\n{'config':<10} {'param MB':>9} {'optim MB':>9} {'peak RSS MB':>12} {'step s':>8} "
          f"{'param/dp4':>10} {'optim/dp4':>10} {'RSS/dp4':>8} {'step/dp4':>9}")
    for name, r in results.items():
        ratio = {k: r[k] / base[k] for k in ("param_bytes", "optim_bytes", "peak_rss_mb", "step_s")} if base else {}
        r["ratio_to_dp4"] = ratio
        print(f"{name:<10} {r['param_bytes'] / 2**20:>9.2f} {r['optim_bytes'] / 2**20:>9.2f} "
              f"{r['peak_rss_mb']:>12.0f} {r['step_s']:>8.3f} " +
              (f"{ratio['param_bytes']:>10.3f} {ratio['optim_bytes']:>10.3f} {ratio['peak_rss_mb']:>8.3f} "
               f"{ratio['step_s']:>9.3f}" if ratio else ""))
    if base and "dp2_mp2" in results:
        half = results["dp2_mp2"]["ratio_to_dp4"]["param_bytes"]
        print(f"\nmp=2 parameter bytes per rank / dp=4: {half:.3f} (goal 0.5 within 5%: "
              f"{'met' if abs(half - 0.5) <= 0.025 else 'NOT met'})")
    out = {"configs": results, "args": vars(args), "torch": torch.__version__, "platform": platform.platform(),
           "cpus": os.cpu_count(), "note": "4 ranks on gloo, one thread each; largest rank per figure"}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "hybrid_memory.json")
    atomic_write_text(path, json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
