"""Hybrid parallel memory on the GPT recipe's model: parameter + AdamW bytes per rank, peak RSS, step time.

4 ranks on gloo, one thread each, the recipe's GPT (fleetlite.text.gpt) widened to --width 512 (4 layers, 8
heads, byte vocabulary 256) so the weights dominate. Configurations, each in a fresh set of 4 processes (so
peak RSS is its own): dp=4 (the peer: plain data parallel), mp=2 x dp=2, pp=2 x dp=2, mp=4, and mp=2 x sharding=2
with sharding stage 3 (FSDP2 over the sharding axis beside tensor parallelism: Note [stage 3 beside mp]).
"Parameter bytes", "gradient bytes" (after the last backward, before its step; not measured for pp, whose
backward runs inside train_batch) and "optimizer bytes" are counted from the tensors each rank holds (its
slices / its stage / its shards; AdamW's exp_avg and exp_avg_sq); the largest rank is reported. Step time is the
median over the timed steps of one optimizer step on the same global batch. Goals: mp=2 halves the parameter
bytes per rank (within 5%); mp=2 x stage 3 holds a quarter of dp=4's parameter + gradient + optimizer bytes
(within 5%).

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

# (dp, mp, pp[, sharding degree with stage 3])
CONFIGS = {"dp4": (4, 1, 1), "dp2_mp2": (2, 2, 1), "dp2_pp2": (2, 1, 2), "mp4": (1, 4, 1), "mp2_stage3": (1, 2, 1, 2)}


def _bytes(tensors) -> int:
    """The bytes the tensors' storages hold, each storage once: a slice that viewed the full weight would count
    the full weight (what the process really keeps), not its own elements."""
    storages = {}
    for t in tensors:
        if torch.is_tensor(t):
            s = (t.to_local() if hasattr(t, "to_local") else t).untyped_storage()  # a stage-3 shard: its local part
            storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def _rank(rank, world, degrees, steps, width, layers, batch, seq):
    from fleetlite.distributed import fleet
    from fleetlite.distributed.fleet.meta_parallel import PipelineLayer
    from fleetlite.text.corpus import batch_of_windows, encode, synthetic_corpus
    from fleetlite.text.gpt import GPT, GPTConfig, gpt_loss, gpt_pipeline_descs

    torch.set_num_threads(1)
    dp, mp, pp, sharding = (*degrees, 1)[:4]
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": dp, "mp_degree": mp, "pp_degree": pp, "sharding_degree": sharding}
    if sharding > 1:
        # the blocks are FSDP2's units (torchtitan's choice); the tied token table stays with the root, whose
        # parameters are whole through the root's forward (the head reads it outside the table's own forward)
        strategy.sharding, strategy.sharding_configs = True, {"stage": 3, "wrap": ["Block"]}
    rows = batch // (dp * sharding)
    strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": max(rows // 2, 1)}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    cfg = GPTConfig(width=width, layers=layers, heads=8, seq_len=seq)
    layer = PipelineLayer(gpt_pipeline_descs(cfg), topology=hcg.topology(), loss_fn=gpt_loss) if pp > 1 \
        else GPT(cfg)
    model = fleet.distributed_model(layer)
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    ids = encode(synthetic_corpus(50_000))
    r = hcg.get_data_sharding_parallel_rank()
    times, grad_bytes = [], None
    for step in range(steps + 1):  # the first step (state allocation, warm-up) is not timed
        x, y = batch_of_windows(ids, batch, seq, 0, step)
        x, y = x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows]
        torch.distributed.barrier()
        start = time.perf_counter()
        if pp > 1:
            model.train_batch([x, y], opt)
        else:
            model(x, y).backward()
            grad_bytes = _bytes(p.grad for p in layer.parameters() if p.grad is not None)
            opt.step()
            opt.clear_grad()
        torch.distributed.barrier()
        if step:
            times.append(time.perf_counter() - start)
    inner = getattr(opt, "inner_opt", opt)
    state = [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    param_bytes, optim_bytes = _bytes(layer.parameters()), _bytes(state)
    return {"param_bytes": param_bytes, "grad_bytes": grad_bytes, "optim_bytes": optim_bytes,
            "total_bytes": None if grad_bytes is None else param_bytes + grad_bytes + optim_bytes,
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
        results[name] = {k: None if per_rank[0][k] is None else max(r[k] for r in per_rank) for k in per_rank[0]}
        results[name]["param_bytes_per_rank"] = [r["param_bytes"] for r in per_rank]
        print(f"{name}: {results[name]}", flush=True)
    base = results.get("dp4")
    print(f"\n{'config':<11} {'param MB':>9} {'grad MB':>8} {'optim MB':>9} {'peak RSS MB':>12} {'step s':>8} "
          f"{'param/dp4':>10} {'optim/dp4':>10} {'p+g+o/dp4':>10} {'RSS/dp4':>8} {'step/dp4':>9}")
    keys = ("param_bytes", "optim_bytes", "total_bytes", "peak_rss_mb", "step_s")
    mb = lambda v: "-" if v is None else f"{v / 2**20:.2f}"  # noqa: E731
    num = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for name, r in results.items():
        ratio = {k: None if r[k] is None or base[k] is None else r[k] / base[k] for k in keys} if base else {}
        r["ratio_to_dp4"] = ratio
        print(f"{name:<11} {mb(r['param_bytes']):>9} {mb(r['grad_bytes']):>8} {mb(r['optim_bytes']):>9} "
              f"{r['peak_rss_mb']:>12.0f} {r['step_s']:>8.3f} " +
              (f"{num(ratio['param_bytes']):>10} {num(ratio['optim_bytes']):>10} {num(ratio['total_bytes']):>10} "
               f"{num(ratio['peak_rss_mb']):>8} {num(ratio['step_s']):>9}" if ratio else ""))
    if base and "dp2_mp2" in results:
        half = results["dp2_mp2"]["ratio_to_dp4"]["param_bytes"]
        print(f"\nmp=2 parameter bytes per rank / dp=4: {half:.3f} (goal 0.5 within 5%: "
              f"{'met' if abs(half - 0.5) <= 0.025 else 'NOT met'})")
    if base and "mp2_stage3" in results:
        quarter = results["mp2_stage3"]["ratio_to_dp4"]["total_bytes"]
        print(f"mp=2 x stage 3 parameter + gradient + optimizer bytes per rank / dp=4: {quarter:.3f} (goal 0.25 "
              f"within 5%: {'met' if abs(quarter - 0.25) <= 0.0125 else 'NOT met'})")
    out = {"configs": results, "args": vars(args), "torch": torch.__version__, "platform": platform.platform(),
           "cpus": os.cpu_count(), "note": "4 ranks on gloo, one thread each; largest rank per figure"}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "hybrid_memory.json")
    atomic_write_text(path, json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
