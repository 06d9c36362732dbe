"""What fault tolerance costs per training step: Trainer.fit with the Preemption callback against without it.

Preemption agrees on a stop step with a small asynchronous all-reduce on its
own gloo group, about every 0.25 s of training (Note [pre-emption agreement]
in fleetlite/trainer/preemption.py); the "every step" rows force one per
optimizer step (check_interval_s=0), the worst case. Both settings run in the same 2 processes
(gloo, one thread each), on the same data, timed alternately in blocks of a
few epochs so machine noise hits both alike. Two models: the Paddle
quick-start CNN on 32x32 images (a small real step) and a tiny MLP (a step of
well under a millisecond: the worst case for a fixed per-step cost). Also
printed: the bare cost of one poll (start the all-reduce, wait for the
previous one), timed over many polls.

    python benchmarks/fault_overhead.py [--blocks 6] [--epochs 1] [--samples 4096] [--batch 32]

Prints a table of ratios (with Preemption / without) and writes
benchmarks/results/fault_overhead.json.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetlite.testing import run_ranks  # noqa: E402
from fleetlite.utils.atomic import atomic_write_text  # noqa: E402


def _data(kind: str, samples: int, batch: int):
    from fleetlite.io import TensorLoader

    if kind == "cnn":
        from fleetlite.vision.datasets import SyntheticCifar10

        x, y = SyntheticCifar10(mode="train", size=samples).as_tensors()
        return TensorLoader(x, y, batch, shuffle=True, augment=True, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 32, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())


def _trainer(kind: str):
    import fleetlite
    from fleetlite.vision.models import tutorial_cnn

    torch.manual_seed(0)
    net = tutorial_cnn(10) if kind == "cnn" else torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                                                     torch.nn.Linear(32, 2))
    return fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9),
                             torch.nn.CrossEntropyLoss(), device="cpu")


def _poll_cost(polls: int) -> float:
    """Seconds per Preemption poll (start one async flag all-reduce, wait for the previous one), no step between."""
    from fleetlite.callbacks import Preemption

    class _T:  # the few attributes the callback touches
        callbacks = None
        save_dir = None
        global_step = 0
        at_step_boundary = True
        stop_training = False
        preempted = None

    cb = Preemption(verbose=0, save_dir=os.devnull)  # a directory is never used: no signal comes
    cb.set_model(_T())
    cb.on_train_begin()
    t0 = time.perf_counter()
    for _ in range(polls):
        cb._poll()
    elapsed = time.perf_counter() - t0
    cb.on_train_end()
    return elapsed / polls


SETTINGS = {"without": None, "default": 0.25, "every step": 0.0}  # Preemption(check_interval_s=...)


def measure(rank: int, world: int, kind: str, blocks: int, epochs: int, samples: int, batch: int) -> dict:
    import fleetlite
    from fleetlite.callbacks import Preemption

    torch.set_num_threads(1)
    data = _data(kind, samples, batch)
    kw = {"batch_size": batch, "verbose": 0} if kind == "mlp" else {"verbose": 0}

    def callbacks(interval):
        return [] if interval is None else [Preemption(verbose=0, save_dir=os.devnull, check_interval_s=interval)]

    trainers = {name: _trainer(kind) for name in SETTINGS}
    for name, interval in SETTINGS.items():  # warm-up: first-call costs
        trainers[name].fit(data, epochs=1, callbacks=callbacks(interval), **kw)
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    steps = 0
    names = list(SETTINGS)
    for b in range(blocks):
        for name in names[b % len(names):] + names[:b % len(names)]:  # rotate the order: no position favoured
            interval = SETTINGS[name]
            fleetlite.distributed.barrier()
            t0 = time.perf_counter()
            before = trainers[name].global_step
            trainers[name].fit(data, epochs=epochs, callbacks=callbacks(interval), **kw)
            fleetlite.distributed.barrier()
            times[name].append(time.perf_counter() - t0)
            steps = trainers[name].global_step - before
    return {"times": times, "steps_per_block": steps, "poll_s": _poll_cost(2000)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=1, help="epochs per timed block")
    ap.add_argument("--samples", type=int, default=4096, help="training samples per epoch (all ranks)")
    ap.add_argument("--batch", type=int, default=32, help="batch size per rank")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "fault_overhead.json"))
    args = ap.parse_args()
    rows = []
    for kind in ("cnn", "mlp"):
        samples = args.samples * (8 if kind == "mlp" else 1)  # MLP steps are ~10x shorter: longer blocks, less noise
        res = run_ranks(measure, world_size=2, args=(kind, args.blocks, args.epochs, samples, args.batch),
                        timeout=1800)[0]
        base = res["times"]["without"]
        row = {"model": kind, "ranks": 2, "steps_per_block": res["steps_per_block"], "times_s": res["times"],
               "step_ms": 1e3 * statistics.median(base) / res["steps_per_block"], "poll_us": 1e6 * res["poll_s"]}
        for name in ("default", "every step"):
            row[f"ratio_{name.replace(' ', '_')}"] = statistics.median(
                [w / o for w, o in zip(res["times"][name], base)])
        rows.append(row)
    header = (f"{'model':>5} {'ranks':>5} {'steps':>6} {'step ms':>8} {'poll us':>8} {'default/without':>15} "
              f"{'every-step/without':>18}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['model']:>5} {r['ranks']:>5} {r['steps_per_block']:>6} {r['step_ms']:>8.2f} {r['poll_us']:>8.1f} "
              f"{r['ratio_default']:>15.3f} {r['ratio_every_step']:>18.3f}")
    out = {"benchmark": "fault_overhead", "what": "Trainer.fit with Preemption (async flag all-reduce every ~0.25 s, "
           "or every step) vs without", "config": {k: v for k, v in vars(args).items() if k != "out"},
           "results": rows, "torch": str(torch.__version__), "machine": f"{platform.machine()} {os.cpu_count()} cores",
           "note": "ratio = median over blocks of (with / without), same processes, settings alternated; poll_us = "
                   "one poll alone (start an all-reduce, wait for the previous one) with no step in between"}
    atomic_write_text(args.out, json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
