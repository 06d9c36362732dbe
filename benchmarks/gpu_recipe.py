"""The CIFAR-10 recipe on a GPU: images/s and time per epoch vs a hand-written loop, and the engine vs DDP.

Runs only with CUDA (without it, it says so and exits 0). Measured in the same run:

* the recipe, ``experiment=airbench data=synthetic`` (fast net, bf16, channels-last data on the GPU), through
  ``recipes/cifar10.py`` in a subprocess, timed from its epoch log;
* a hand-written loop with the same model, optimizer, autocast and data already on the device (the peer);
* with two or more GPUs: fleetlite's DataParallel vs torch DDP on 2 ranks over NCCL (step time).

    python benchmarks/gpu_recipe.py [--epochs 4] [--train-size 50000]

Prints a table and writes benchmarks/results/gpu_recipe.json (with the GPU model).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def hand_loop(epochs: int, train_size: int, batch_size: int = 1024) -> float:
    """Seconds per epoch (median over epochs after the first) of a plain loop: same net, data on the GPU, bf16."""
    from fleetlite.io import TensorLoader
    from fleetlite.vision.datasets import SyntheticCifar10
    from fleetlite.vision.models import build_model

    x, y = SyntheticCifar10(mode="train", size=train_size).as_tensors()
    loader = TensorLoader(x, y, batch_size=batch_size, shuffle=True, drop_last=True, device="cuda",
                          channels_last=True, num_replicas=1, rank=0, pad_mode="reflect")
    model = build_model("fast", num_classes=10).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.85, nesterov=True, weight_decay=2e-6)
    torch.backends.cudnn.benchmark = True
    times = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for images, labels in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(images), labels, label_smoothing=0.2)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    later = sorted(times[1:] or times)
    return later[len(later) // 2]


def recipe(epochs: int, train_size: int) -> float:
    """Seconds per epoch of the recipe (median over epochs after the first), from the wall time between epochs."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, os.path.join(ROOT, "recipes", "cifar10.py"), "experiment=airbench", "data=synthetic",
               f"data.train_size={train_size}", "data.test_size=1024", f"trainer.epochs={epochs}",
               "trainer.plot=false", "trainer.eval_freq=1000", f"run_dir={tmp}/run"]
        stamps: dict[int, float] = {}  # epoch -> when its first progress line appeared
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
    gaps = sorted(gaps)
    return gaps[len(gaps) // 2]


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
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        torch.cuda.synchronize()
        out[kind] = (time.perf_counter() - start) / steps
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-size", type=int, default=50000)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_recipe: no CUDA device here; this benchmark runs only on a GPU machine (nothing measured)")
        return 0
    gpu = torch.cuda.get_device_name(0)
    hand = hand_loop(args.epochs, args.train_size)
    rec = recipe(args.epochs, args.train_size)
    rows = [("recipe (airbench, synthetic)", rec), ("hand-written loop", hand)]
    result = {"gpu": gpu, "torch": torch.__version__, "python": platform.python_version(),
              "train_size": args.train_size, "epochs": args.epochs,
              "recipe_s_per_epoch": rec, "hand_s_per_epoch": hand, "recipe_vs_hand": rec / hand,
              "recipe_images_per_s": args.train_size / rec, "hand_images_per_s": args.train_size / hand}
    if torch.cuda.device_count() >= 2:
        from fleetlite.testing import run_ranks

        steps = run_ranks(_engine_step, world_size=2, init=False, timeout=600)
        engine = max(s["fleetlite"] for s in steps)
        ddp = max(s["ddp"] for s in steps)
        result.update(engine_step_s=engine, ddp_step_s=ddp, engine_vs_ddp=engine / ddp)
        rows += [("engine step, 2 GPUs (NCCL)", engine), ("DDP step, 2 GPUs (NCCL)", ddp)]
    print(f"GPU: {gpu}")
    print(f"{'what':34} {'seconds':>10}")
    for name, value in rows:
        print(f"{name:34} {value:10.4f}")
    print(f"recipe / hand loop: {result['recipe_vs_hand']:.2f}x  ({result['recipe_images_per_s']:.0f} vs "
          f"{result['hand_images_per_s']:.0f} images/s)")
    from fleetlite.utils.atomic import atomic_write_text

    out = os.path.join(ROOT, "benchmarks", "results", "gpu_recipe.json")
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
