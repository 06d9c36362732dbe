"""Trainer.fit against a hand-written loop: epoch time with the same model, data pipeline, engine and optimizer.

Both loops run in the same process(es), on the same kind of data (the
TensorLoader pipeline over synthetic CIFAR-10), with the model wrapped by
``fleet.distributed_model`` and the optimizer by ``fleet.distributed_optimizer``
(what the Trainer does itself), one thread per rank. They are timed
alternately in blocks of a few epochs, so machine noise hits both alike; the
Trainer's time is the wall time of a whole ``fit(epochs=E)`` call (setup,
callbacks, progress line, epoch-end reduction included). The hand loop logs
its running loss every ``log_freq`` steps like the Trainer's progress bar
(both to /dev/null). Single process and 2 ranks (gloo).

The ``mlp`` rows time a small MLP on in-memory tensors: ``Trainer.fit((x, y))`` (the Trainer's tensor
adapter, one gather per batch) against a hand loop that takes each batch's indices from a
``DistributedBatchSampler`` and indexes ``x[idx]``, ``y[idx]`` itself; a step is short there, so the
cost of the input path shows.

    python benchmarks/trainer_overhead.py [--blocks 4] [--epochs 2] [--samples 1024] [--batch 64]
    python benchmarks/trainer_overhead.py --only compile      # just the torch.compile rows, merged into the JSON
    python benchmarks/trainer_overhead.py --only mlp          # just the in-memory MLP rows, merged into the JSON

Prints a table of ratios (Trainer / hand loop; target <= 1.03) and writes
benchmarks/results/trainer_overhead.json. The compile rows time
``Trainer(compile=True)`` against the same Trainer uncompiled (epoch time after
a warm-up epoch that pays the compilation, whose time is reported apart).
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
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetlite.testing import run_ranks  # noqa: E402
from fleetlite.utils.atomic import atomic_write_text  # noqa: E402


def _setup(samples: int, batch: int, seed: int):
    from fleetlite.io import TensorLoader
    from fleetlite.vision.datasets import SyntheticCifar10
    from fleetlite.vision.models import tutorial_cnn

    x, y = SyntheticCifar10(mode="train", size=samples).as_tensors()
    torch.manual_seed(seed)
    net = tutorial_cnn(10)
    return net, TensorLoader(x, y, batch, shuffle=True, augment=True, seed=seed)


def _hand_epochs(model, opt, loader, epochs: int, start: int, log_freq: int, sink) -> None:
    for epoch in range(start, start + epochs):
        loader.set_epoch(epoch)
        model.train()
        total, count = torch.zeros((), dtype=torch.float64), 0
        for step, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            total += loss.detach().double() * y.shape[0]
            count += y.shape[0]
            if (step + 1) % log_freq == 0:
                print(f"epoch {epoch} step {step + 1} loss {(total / count).item():.4f}", file=sink, flush=True)


def _compare(setup, blocks: int, epochs: int, lr: float, log_freq: int, **fit) -> dict:
    """Time blocks of hand-loop epochs against ``Trainer.fit`` blocks; ``setup(hand)`` gives a fresh
    ``(net, data)``: for the hand loop an iterable of ``(x, y)`` with ``set_epoch``, else what fit takes."""
    torch.set_num_threads(1)
    import fleetlite
    from fleetlite.distributed import fleet  # the facade, as the Trainer uses it
    from fleetlite.trainer.callbacks import ProgressBar
    fleet.init(is_collective=True)
    hand_net, hand_data = setup(hand=True)
    model = fleet.distributed_model(hand_net)
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
    tr_net, tr_data = setup(hand=False)
    trainer = fleetlite.Trainer(tr_net, torch.optim.SGD(tr_net.parameters(), lr=lr, momentum=0.9),
                                torch.nn.CrossEntropyLoss(), device="cpu")
    sink = open(os.devnull, "w")
    bar = [ProgressBar(stream=sink, log_freq=log_freq)]
    # warm-up: one epoch each (first-call costs: autograd, allocator, lazy imports)
    _hand_epochs(model, opt, hand_data, 1, 0, log_freq, sink)
    trainer.fit(tr_data, epochs=1, callbacks=bar, log_freq=log_freq, **fit)
    hand, ours = [], []
    for b in range(blocks):
        fleetlite.distributed.barrier()
        t0 = time.perf_counter()
        _hand_epochs(model, opt, hand_data, epochs, 1 + b * epochs, log_freq, sink)
        fleetlite.distributed.barrier()
        t1 = time.perf_counter()
        trainer.fit(tr_data, epochs=epochs, callbacks=bar, log_freq=log_freq, **fit)
        fleetlite.distributed.barrier()
        t2 = time.perf_counter()
        hand.append((t1 - t0) / epochs)
        ours.append((t2 - t1) / epochs)
    sink.close()
    return {"hand_s": hand, "trainer_s": ours, "steps_per_epoch": len(hand_data)}


def measure(rank: int, world: int, blocks: int, epochs: int, samples: int, batch: int, lr: float,
            log_freq: int) -> dict:
    """The CNN rows: the quick-start CNN on the TensorLoader pipeline."""
    return _compare(lambda hand: _setup(samples, batch, seed=0), blocks, epochs, lr, log_freq)


class _IndexedBatches:
    """The hand loop's batches of in-memory tensors: ``x[idx], y[idx]`` for a DistributedBatchSampler's ``idx``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch: int) -> None:
        from fleetlite.io import DistributedBatchSampler

        self.x, self.y = x, y
        self.sampler = DistributedBatchSampler(range(len(x)), batch, shuffle=True, seed=0)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        for idx in self.sampler:
            idx = torch.as_tensor(idx)
            yield self.x[idx], self.y[idx]


def _mlp_setup(samples: int, batch: int, hand: bool):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 32, generator=g)
    y = torch.randint(0, 10, (samples,), generator=g)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    return net, (_IndexedBatches(x, y, batch) if hand else (x, y))


def measure_mlp(rank: int, world: int, blocks: int, epochs: int, samples: int, batch: int, lr: float,
                log_freq: int) -> dict:
    """The mlp rows: Trainer.fit((x, y)) against a hand loop indexing batches of in-memory tensors."""
    samples *= 16  # a step is ~20x shorter than the CNN's: more of them per block (blocks of ~1 s)
    return _compare(lambda hand: _mlp_setup(samples, batch, hand), blocks, epochs, lr, log_freq,
                    batch_size=batch, shuffle=True)


def measure_compile(rank: int, world: int, blocks: int, epochs: int, samples: int, batch: int, lr: float,
                    log_freq: int) -> dict:
    torch.set_num_threads(1)
    import fleetlite
    from fleetlite.trainer.callbacks import ProgressBar

    sink = open(os.devnull, "w")
    bar = [ProgressBar(stream=sink, log_freq=log_freq)]
    trainers, warm = {}, {}
    for name, comp in (("eager", False), ("compiled", True)):
        net, loader = _setup(samples, batch, seed=0)
        t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9),
                              torch.nn.CrossEntropyLoss(), device="cpu", compile=comp)
        t0 = time.perf_counter()
        t.fit(loader, epochs=1, callbacks=bar, log_freq=log_freq)  # pays the compilation
        warm[name] = time.perf_counter() - t0
        trainers[name] = (t, loader)
    # the peer: the hand loop over the same engine, eager and with torch.compile(net) (what a user writes)
    from fleetlite.distributed import fleet

    fleet.init(is_collective=True)
    hands = {}
    for name, comp in (("hand_eager", False), ("hand_compiled", True)):
        net, loader = _setup(samples, batch, seed=0)
        model = fleet.distributed_model(torch.compile(net) if comp else net)
        opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
        _hand_epochs(model, opt, loader, 1, 0, log_freq, sink)  # pays the compilation
        hands[name] = (model, opt, loader)
    times: dict[str, list[float]] = {"eager": [], "compiled": [], "hand_eager": [], "hand_compiled": []}
    for b in range(blocks):
        for name, (t, loader) in trainers.items():
            fleetlite.distributed.barrier()
            t0 = time.perf_counter()
            t.fit(loader, epochs=epochs, callbacks=bar, log_freq=log_freq)
            fleetlite.distributed.barrier()
            times[name].append((time.perf_counter() - t0) / epochs)
        for name, (model, opt, loader) in hands.items():
            fleetlite.distributed.barrier()
            t0 = time.perf_counter()
            _hand_epochs(model, opt, loader, epochs, 1 + b * epochs, log_freq, sink)
            fleetlite.distributed.barrier()
            times[name].append((time.perf_counter() - t0) / epochs)
    sink.close()
    ratios = [c / e for c, e in zip(times["compiled"], times["eager"])]
    hand_ratios = [c / e for c, e in zip(times["hand_compiled"], times["hand_eager"])]
    return {"ranks": world, "eager_s": times["eager"], "compiled_s": times["compiled"],
            "eager_median_s": statistics.median(times["eager"]),
            "compiled_median_s": statistics.median(times["compiled"]), "ratio": statistics.median(ratios),
            "hand_eager_s": times["hand_eager"], "hand_compiled_s": times["hand_compiled"],
            "hand_ratio": statistics.median(hand_ratios), "first_epoch_s": warm, "device": "cpu"}


def run_compile_rows(args, cfg) -> list[dict]:
    rows = []
    for world in (int(w) for w in args.ranks.split(",")):
        res = run_ranks(measure_compile, world_size=world, args=cfg, timeout=1800, init=world > 1)[0]
        rows.append(res)
    header = (f"{'ranks':>5} {'eager s/epoch':>13} {'compiled s/epoch':>16} {'ratio':>6} {'hand-loop ratio':>15} "
              f"{'compile warm-up s':>17}")
    print(header)
    print("-" * len(header))
    for r in rows:
        extra = r["first_epoch_s"]["compiled"] - r["first_epoch_s"]["eager"]
        print(f"{r['ranks']:>5} {r['eager_median_s']:>13.3f} {r['compiled_median_s']:>16.3f} {r['ratio']:>6.3f} "
              f"{r['hand_ratio']:>15.3f} {extra:>17.1f}")
    return rows


def run_overhead_rows(fn, args, cfg) -> list[dict]:
    rows = []
    for world in (int(w) for w in args.ranks.split(",")):
        # a fresh process per setting (one rank too), so every setting starts from the same state
        res = run_ranks(fn, world_size=world, args=cfg, timeout=1800, init=world > 1)[0]
        rows.append(summarize(world, res))
        print(f"{world} rank(s): hand {rows[-1]['hand_median_s']:.3f} s/epoch, Trainer "
              f"{rows[-1]['trainer_median_s']:.3f} s/epoch", flush=True)
    header = f"{'ranks':>5} {'steps/epoch':>11} {'hand s/epoch':>12} {'Trainer s/epoch':>15} {'ratio':>6} {'target':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        ok = "ok" if r["ratio"] <= 1.03 else "MISSED"
        print(f"{r['ranks']:>5} {r['steps_per_epoch']:>11} {r['hand_median_s']:>12.3f} {r['trainer_median_s']:>15.3f} "
              f"{r['ratio']:>6.3f} {'<=1.03 ' + ok:>7}")
    return rows


def summarize(ranks: int, res: dict) -> dict:
    ratios = [t / h for t, h in zip(res["trainer_s"], res["hand_s"])]
    return {"ranks": ranks, "steps_per_epoch": res["steps_per_epoch"], "hand_s": res["hand_s"],
            "trainer_s": res["trainer_s"], "hand_median_s": statistics.median(res["hand_s"]),
            "trainer_median_s": statistics.median(res["trainer_s"]), "block_ratios": ratios,
            "ratio": statistics.median(ratios)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2, help="epochs per timed block")
    ap.add_argument("--samples", type=int, default=2048, help="training images per epoch (all ranks)")
    ap.add_argument("--batch", type=int, default=64, help="batch size per rank")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--log-freq", type=int, default=10)
    ap.add_argument("--ranks", default="1,2", help="comma-separated world sizes to measure")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "trainer_overhead.json"))
    ap.add_argument("--only", choices=["all", "overhead", "compile", "mlp"], default="all",
                    help="compile / mlp: only those rows, merged into an existing JSON")
    args = ap.parse_args()
    cfg = (args.blocks, args.epochs, args.samples, args.batch, args.lr, args.log_freq)
    config = {k: v for k, v in vars(args).items() if k != "out"}
    if args.only in ("compile", "mlp"):
        out = json.load(open(args.out)) if os.path.exists(args.out) else {"benchmark": "trainer_overhead"}
        if args.only == "compile":
            out["compile"] = {"config": config, "results": run_compile_rows(args, cfg), "note": COMPILE_NOTE}
        else:
            out["mlp"] = {"config": config, "results": run_overhead_rows(measure_mlp, args, cfg), "note": MLP_NOTE}
        atomic_write_text(args.out, json.dumps(out, indent=2))
        print(f"wrote {args.out}")
        return
    compile_rows = run_compile_rows(args, cfg) if args.only == "all" else None
    print("quick-start CNN, TensorLoader:")
    rows = run_overhead_rows(measure, args, cfg)
    mlp_rows = None
    if args.only == "all":
        print("small MLP, in-memory tensors:")
        mlp_rows = run_overhead_rows(measure_mlp, args, cfg)
    out = {"benchmark": "trainer_overhead", "model": "tutorial_cnn (Paddle quick-start CNN)",
           "data": "TensorLoader over SyntheticCifar10, crop+flip", "config": config, "results": rows,
           "torch": str(torch.__version__), "machine": f"{platform.machine()} {os.cpu_count()} cores",
           "note": "ratio = median over blocks of (Trainer block time / hand-loop block time), same processes"}
    if compile_rows is not None:
        out["compile"] = {"results": compile_rows, "note": COMPILE_NOTE}
    if mlp_rows is not None:
        out["mlp"] = {"results": mlp_rows, "note": MLP_NOTE}
    if args.only == "overhead" and os.path.exists(args.out):  # keep the rows this run did not measure
        previous = json.load(open(args.out))
        out.update({k: previous[k] for k in ("compile", "mlp") if k in previous})
    atomic_write_text(args.out, json.dumps(out, indent=2))
    print(f"wrote {args.out}")


COMPILE_NOTE = ("ratio = median over blocks of compiled / eager Trainer epoch time (CPU, inductor); hand_ratio = the "
                "same for a hand loop with torch.compile(net), same processes; first_epoch_s includes the compilation")
MLP_NOTE = ("Linear(32,128)-ReLU-Linear(128,10) on 16x --samples in-memory float tensors: Trainer.fit((x, y)) vs a "
            "hand loop indexing x[idx], y[idx] with a DistributedBatchSampler's indices; ratio as for the CNN rows")


if __name__ == "__main__":
    main()
