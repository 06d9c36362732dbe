"""Peak memory of Trainer.predict: streamed to disk (output_dir=...) against in memory, as the data grows.

Each setting runs in a fresh process (its peak RSS is the process's ru_maxrss): a small MLP predicts N
samples (16 features in, ``--width`` outputs out, generated per index so the input costs no memory) in
batches of ``--batch``, either kept in memory (``predict(stack_outputs=True)``) or streamed with
``predict(output_dir=...)``. The reference row is the same process predicting 1,000 samples. Streaming
should stay flat as N grows; in memory grows with N x width x 4 bytes (and the gather's copies).

    python benchmarks/predict_memory.py [--sizes 50000,200000] [--width 32] [--batch 1000]

Prints a table and writes benchmarks/results/predict_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CHILD = r"""
import resource, sys, tempfile, time, torch
import fleetlite
from torch.utils.data import Dataset

class Generated(Dataset):
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
    def __getitem__(self, i): return torch.full((16,), float(i % 97) / 97.0)

n, width, batch, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, width))
t = fleetlite.Trainer(net, device="cpu")
t0 = time.perf_counter()
if mode == "stream":
    with tempfile.TemporaryDirectory() as d:
        paths = t.predict(Generated(n), batch_size=batch, output_dir=d)
        size = sum(p.stat().st_size for p in paths)
else:
    out = t.predict(Generated(n), batch_size=batch, stack_outputs=True)
    size = out.numel() * out.element_size()
secs = time.perf_counter() - t0
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, secs, size)
"""


def run(n: int, width: int, batch: int, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(width), str(batch), mode], env=env,
                         capture_output=True, text=True, timeout=1800, cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise RuntimeError(f"{mode} N={n} failed:\n{out.stderr[-2000:]}")
    peak, secs, size = out.stdout.strip().splitlines()[-1].split()
    return {"n": n, "mode": mode, "peak_rss_mib": float(peak), "seconds": float(secs),
            "output_mib": int(size) / 2**20}


def main() -> None:
    from fleetlite.utils.atomic import atomic_write_text

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="50000,200000")
    ap.add_argument("--width", type=int, default=32, help="outputs per sample")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "predict_memory.json"))
    args = ap.parse_args()
    rows = []
    for mode in ("memory", "stream"):
        base = run(1000, args.width, args.batch, mode)
        for n in (int(s) for s in args.sizes.split(",")):
            r = run(n, args.width, args.batch, mode)
            r["over_1k_mib"] = r["peak_rss_mib"] - base["peak_rss_mib"]
            rows.append(r)
            print(f"{mode:>6} N={n:>7}: peak RSS {r['peak_rss_mib']:.0f} MiB (+{r['over_1k_mib']:.0f} over N=1000), "
                  f"{r['seconds']:.1f} s, outputs {r['output_mib']:.1f} MiB", flush=True)
    header = f"{'mode':>6} {'N':>8} {'outputs MiB':>11} {'peak RSS MiB':>12} {'+ over N=1k':>11} {'seconds':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['mode']:>6} {r['n']:>8} {r['output_mib']:>11.1f} {r['peak_rss_mib']:>12.0f} "
              f"{r['over_1k_mib']:>11.0f} {r['seconds']:>8.1f}")
    import torch

    out = {"benchmark": "predict_memory", "config": {k: v for k, v in vars(args).items() if k != "out"},
           "results": rows, "torch": str(torch.__version__),
           "machine": f"{platform.machine()} {os.cpu_count()} cores",
           "note": "peak RSS (ru_maxrss) of a fresh process per row; over_1k = minus the same mode at N=1000"}
    atomic_write_text(args.out, json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
