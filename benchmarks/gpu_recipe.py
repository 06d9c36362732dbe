"""The CIFAR-10 recipe on a GPU vs a hand loop, the Trainer's core and Lightning; a tiny-step MLP; the engine vs DDP.

Runs only with CUDA (without it, it says so and exits 0; ``--device cpu`` runs the same code on the CPU, to
check the script, not to measure). Everything is measured in one process, on the same data, median epoch time
over the epochs after the first:

* ``hand loop``: the airbench net (``fast``), bf16 autocast, Nesterov SGD, label smoothing, batches from a
  :class:`~fleetlite.io.TensorLoader` on the GPU (channels-last, crop + flip); no host sync in the loop;
* ``Trainer core``: ``Trainer.fit(verbose=0)`` with the same net, optimizer, amp (bf16) and loader, no callbacks;
* ``recipe as configured``: the Trainer as ``recipes/cifar10.py`` builds it for ``experiment=airbench`` (Accuracy,
  the recipe's callbacks: LR schedule, run log, metrics.csv, checkpoints every epoch, TerminateOnNaN,
  pre-emption; ``verbose=1`` progress lines every ``log_freq`` steps to a file, as when stdout is not a terminal);
* ``recipe script``: ``recipes/cifar10.py experiment=airbench data=synthetic`` in a subprocess, timed from its
  progress lines (model build, whitening and the one-cycle schedule included); the batch is ``--batch`` in every
  row (``trainer.global_batch_size`` here);
* ``Lightning``: a ``LightningModule`` with the same step, ``precision="bf16-mixed"``, no logger, checkpoint or
  progress bar (only when ``lightning`` is installed);
* ``mlp``: a 3-layer MLP, steps of ~0.2 ms on an H100: a hand loop indexing GPU tensors with a device
  permutation, ``fit((x, y))`` on those GPU tensors, and ``fit`` over a list of ready GPU batches;
* with two or more GPUs: fleetlite's DataParallel vs torch DDP on 2 ranks over NCCL (step time).

    python benchmarks/gpu_recipe.py [--epochs 5] [--train-size 50000] [--batch 512]

Prints a table with ratios to the hand loop (goal: <= 1.05) and writes benchmarks/results/gpu_recipe.json (with
the GPU model and torch version).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DEVICE = torch.device("cuda")


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _median_after_first(times: list[float]) -> float:
    return statistics.median(times[1:] or times)


def _loader(train_size: int, batch: int):
    from fleetlite.io import TensorLoader
    from fleetlite.vision.datasets import SyntheticCifar10
    from fleetlite.vision.transforms import CIFAR10_MEAN, CIFAR10_STD

    x, y = SyntheticCifar10(mode="train", size=train_size).as_tensors()
    return TensorLoader(x, y, batch_size=batch, shuffle=True, drop_last=True, device=DEVICE, channels_last=True,
                        num_replicas=1, rank=0, pad_mode="reflect", mean=CIFAR10_MEAN, std=CIFAR10_STD)


def _net_and_opt(lr: float = 0.2):
    from fleetlite.vision.models import build_model

    torch.manual_seed(0)
    net = build_model("fast", num_classes=10).to(DEVICE).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.85, nesterov=True, weight_decay=2e-6)
    return net, opt


def hand_loop(loader, epochs: int) -> float:
    """Seconds per epoch of a plain loop: the same net, data on the GPU, bf16 autocast, no host sync."""
    net, opt = _net_and_opt()
    times = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        _sync()
        start = time.perf_counter()
        for images, labels in loader:
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(net(images), labels, label_smoothing=0.2)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync()
        times.append(time.perf_counter() - start)
    return _median_after_first(times)


def _epoch_timer():
    from fleetlite.trainer.callbacks import Callback

    class EpochTimer(Callback):
        """Wall time from one epoch's start to the next one's (its saves included), the device drained at each."""

        def __init__(self):
            super().__init__()
            self.stamps: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            _sync()
            self.stamps.append(time.perf_counter())

        def on_train_end(self, logs=None):
            _sync()
            self.stamps.append(time.perf_counter())

        def epoch_time(self) -> float:
            return _median_after_first([b - a for a, b in zip(self.stamps, self.stamps[1:])])

    return EpochTimer()


def _trainer(net, opt, metrics=None, loss=None):
    import fleetlite
    from fleetlite.distributed.fleet import DistributedStrategy

    strategy = DistributedStrategy(amp=True, amp_configs={"dtype": "bfloat16"})
    return fleetlite.Trainer(net, opt, loss or torch.nn.CrossEntropyLoss(label_smoothing=0.2), metrics=metrics,
                             strategy=strategy, device=DEVICE)


def trainer_core(loader, epochs: int) -> float:
    """``Trainer.fit(verbose=0)``: the loop, the engine and amp, no callbacks."""
    net, opt = _net_and_opt()
    timer = _epoch_timer()
    _trainer(net, opt).fit(loader, epochs=epochs, verbose=0, callbacks=[timer])
    return timer.epoch_time()


def recipe_in_process(loader, epochs: int) -> float:
    """The Trainer, metrics and callbacks the recipe builds for ``experiment=airbench``, ``verbose=1`` to a file."""
    from hydra import compose, initialize_config_dir

    import fleetlite
    from fleetlite.recipe.build import build_callbacks, build_scheduler
    from fleetlite.recipe.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = compose("cifar10", overrides=["experiment=airbench"])
    net, opt = _net_and_opt(lr=float(cfg.optim.lr))
    timer = _epoch_timer()
    with tempfile.TemporaryDirectory() as run_dir, open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        scheduler = build_scheduler(cfg.sched, opt, epochs, len(loader))
        callbacks = build_callbacks(cfg.trainer, run_dir, scheduler)
        t = _trainer(net, opt, metrics=fleetlite.metric.Accuracy())
        t.fit(loader, epochs=epochs, log_freq=int(cfg.trainer.log_freq), verbose=1, save_dir=run_dir,
              callbacks=[timer, *callbacks])
    return timer.epoch_time()


def recipe_script(epochs: int, train_size: int, batch: int) -> float:
    """Seconds per epoch of ``recipes/cifar10.py`` (median gap between the epochs' first progress lines)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, os.path.join(ROOT, "recipes", "cifar10.py"), "experiment=airbench", "data=synthetic",
               f"data.train_size={train_size}", "data.test_size=1024", f"trainer.epochs={epochs}",
               f"trainer.global_batch_size={batch}",
               "trainer.plot=false", "trainer.eval_freq=1000", f"run_dir={tmp}/run", f"device={DEVICE.type}"]
        stamps: dict[int, float] = {}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp)
        for line in proc.stdout:
            m = re.search(r"Epoch (\d+)/\d+", line)
            if m and int(m.group(1)) not in stamps:
                stamps[int(m.group(1))] = time.perf_counter()
        if proc.wait() != 0:
            raise SystemExit(f"the recipe failed: {' '.join(cmd)}")
    times = [stamps[e] for e in sorted(stamps)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    if not gaps:
        raise SystemExit("could not time the recipe: no 'Epoch N/M' lines in its output")
    return statistics.median(gaps)


def _lightning():
    for name in ("lightning.pytorch", "pytorch_lightning"):
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            return importlib.import_module(name)
    return None


def lightning(loader, epochs: int, make_net=None, loss_fn=None) -> float | None:
    """Lightning's Trainer with the same step (``precision="bf16-mixed"``), or None when it is not installed."""
    pl = _lightning()
    if pl is None:
        return None
    net, opt = _net_and_opt() if make_net is None else make_net()
    loss_fn = loss_fn or (lambda out, y: F.cross_entropy(out, y, label_smoothing=0.2))

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            x, y = batch
            return loss_fn(self.net(x), y)

        def configure_optimizers(self):
            return opt

    class Timer(pl.Callback):
        def __init__(self):
            self.stamps: list[float] = []

        def on_train_epoch_start(self, trainer, module):
            _sync()
            self.stamps.append(time.perf_counter())

        def on_train_end(self, trainer, module):
            _sync()
            self.stamps.append(time.perf_counter())

    timer = Timer()
    trainer = pl.Trainer(accelerator="gpu" if DEVICE.type == "cuda" else "cpu", devices=1,
                         precision="bf16-mixed", max_epochs=epochs, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[timer])
    trainer.fit(Module(), train_dataloaders=loader)
    return _median_after_first([b - a for a, b in zip(timer.stamps, timer.stamps[1:])])


# -- the tiny-step MLP ------------------------------------------------------------------------------------------
def _mlp_data(steps: int, batch: int):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch, 64, generator=g).to(DEVICE)
    y = torch.randint(0, 10, (steps * batch,), generator=g).to(DEVICE)
    return x, y


def _mlp():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 10)).to(DEVICE)
    return net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)


class Batches:
    """Ready batches, iterable with a length (a list would be read as a dataset of samples)."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def mlp_rows(epochs: int, steps: int, batch: int) -> dict[str, float | None]:
    """Seconds per epoch of ``steps`` tiny MLP steps: hand loop, fit((x, y)) on GPU tensors, fit over GPU batches."""
    import fleetlite

    x, y = _mlp_data(steps, batch)
    out: dict[str, float | None] = {}
    net, opt = _mlp()
    times = []
    for _ in range(epochs):
        _sync()
        start = time.perf_counter()
        order = torch.randperm(x.shape[0], device=DEVICE)  # one permutation per epoch, on the device
        for i in range(steps):
            idx = order[i * batch:(i + 1) * batch]
            loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync()
        times.append(time.perf_counter() - start)
    out["mlp hand loop"] = _median_after_first(times)
    batches = Batches([(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]) for i in range(steps)])
    for name, data in (("mlp Trainer, fit((x, y)) on GPU tensors", (x, y)),
                       ("mlp Trainer, fit(ready GPU batches)", batches)):
        net, opt = _mlp()
        timer = _epoch_timer()
        t = fleetlite.Trainer(net, opt, torch.nn.CrossEntropyLoss(), device=DEVICE)
        kwargs = {"batch_size": batch, "shuffle": True} if isinstance(data, tuple) else {}
        t.fit(data, epochs=epochs, verbose=0, callbacks=[timer], **kwargs)
        out[name] = timer.epoch_time()
    out["mlp Lightning (ready GPU batches)"] = lightning(batches, epochs, make_net=_mlp, loss_fn=F.cross_entropy)
    return out


def _engine_step(rank, world, steps=30):
    import fleetlite
    import fleetlite.distributed as dist
    from fleetlite.vision.models import build_model

    dist.init_parallel_env(backend="nccl")
    device = dist.ParallelEnv().device
    out = {}
    for kind in ("fleetlite", "ddp"):
        torch.manual_seed(0)
        net = build_model("fast", num_classes=10).to(device)
        model = fleetlite.DataParallel(net) if kind == "fleetlite" else \
            torch.nn.parallel.DistributedDataParallel(net, device_ids=[device.index])
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(512, 3, 32, 32, device=device)
        y = torch.randint(0, 10, (512,), device=device)
        for i in range(steps + 5):
            if i == 5:
                torch.cuda.synchronize()
                start = time.perf_counter()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        torch.cuda.synchronize()
        out[kind] = (time.perf_counter() - start) / steps
    return out


def main(argv=None) -> int:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--train-size", type=int, default=50000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--mlp-steps", type=int, default=400)
    parser.add_argument("--device", default="cuda", help="cpu: run the script's code paths, to check it")
    args = parser.parse_args(argv)
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        print("gpu_recipe: no CUDA device here; this benchmark runs only on a GPU machine (nothing measured)")
        return 0
    if DEVICE.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    card = torch.cuda.get_device_name(0) if DEVICE.type == "cuda" else platform.processor() or "cpu"
    loader = _loader(args.train_size, args.batch)
    rows: dict[str, float | None] = {
        "hand loop": hand_loop(loader, args.epochs),
        "Trainer core (fit, verbose=0)": trainer_core(loader, args.epochs),
        "recipe as configured (in process)": recipe_in_process(loader, args.epochs),
        "recipe script (subprocess)": recipe_script(args.epochs, args.train_size, args.batch),
        "Lightning": lightning(loader, args.epochs),
    }
    mlp = mlp_rows(args.epochs, args.mlp_steps, 256)
    result = {"device": card, "torch": torch.__version__, "python": platform.python_version(),
              "date": time.strftime("%Y-%m-%d"), "train_size": args.train_size, "batch": args.batch,
              "epochs": args.epochs, "seconds_per_epoch": {**rows, **mlp}}
    if DEVICE.type == "cuda" and torch.cuda.device_count() >= 2:
        from fleetlite.testing import run_ranks

        steps = run_ranks(_engine_step, world_size=2, init=False, timeout=600)
        result.update(engine_step_s=max(s["fleetlite"] for s in steps), ddp_step_s=max(s["ddp"] for s in steps))
    print(f"device: {card}, torch {torch.__version__}; median seconds per epoch after the first")
    print(f"{'what':44} {'s/epoch':>9} {'vs hand':>8}")
    for group, ref in ((rows, rows["hand loop"]), (mlp, mlp["mlp hand loop"])):
        for name, value in group.items():
            if value is None:
                print(f"{name:44} {'(not installed)':>18}")
            else:
                print(f"{name:44} {value:9.4f} {value / ref:7.2f}x")
    if "engine_step_s" in result:
        print(f"engine vs DDP step, 2 GPUs (NCCL): {result['engine_step_s'] / result['ddp_step_s']:.3f}x")
    if DEVICE.type != "cuda":
        print("(--device cpu: a check of the script, nothing written)")
        return 0
    from fleetlite.utils.atomic import atomic_write_text

    out = os.path.join(ROOT, "benchmarks", "results", "gpu_recipe.json")
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
