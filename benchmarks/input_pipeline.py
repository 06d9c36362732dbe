"""Images per second of the batched tensor pipeline against torchvision's per-sample DataLoader pipeline.

Same data (SyntheticCifar10 uint8 images), same batch size, same augmentation
(random crop with 4 pixels of zero padding, horizontal flip, ToTensor,
Normalize), in one run:

* peer: ``DataLoader(num_workers=2)`` over PIL items with torchvision's
  ``RandomCrop(32, padding=4)``, ``RandomHorizontalFlip()``, ``ToTensor()``,
  ``Normalize(mean, std)`` (persistent workers, timed after a warm-up epoch);
* ``TensorLoader``: fleetlite's batched pipeline (one gather per batch);
* ``airbench-style``: a plain batched uint8 crop (masked copies per shift)
  + flip + normalise, for reference.

Prints a table of ratios against the peer and writes
``benchmarks/results/input_pipeline.json``. Target: TensorLoader >= 4x.

    python benchmarks/input_pipeline.py [--size 10000] [--batch-size 512] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from fleetlite.io import DataLoader, TensorLoader  # noqa: E402
from fleetlite.utils.atomic import atomic_write_text  # noqa: E402
from fleetlite.vision.datasets import SyntheticCifar10  # noqa: E402
from fleetlite.vision.transforms import CIFAR10_MEAN, CIFAR10_STD, normalize  # noqa: E402

TARGET = 4.0


def time_passes(make_iter, epochs: int, n_images: int) -> float:
    """Images per second over ``epochs`` full passes, after one untimed warm-up pass."""
    for _ in make_iter():
        pass
    start = time.perf_counter()
    for _ in range(epochs):
        for _ in make_iter():
            pass
    return epochs * n_images / (time.perf_counter() - start)


def torchvision_peer(size: int, batch_size: int, epochs: int, workers: int) -> float:
    from torchvision import transforms as T

    tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    ds = SyntheticCifar10(mode="train", size=size, transform=tf)  # PIL items, like torchvision's CIFAR10
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=True)
    return time_passes(lambda: loader, epochs, size)


def tensor_loader(images, labels, batch_size: int, epochs: int, **kw) -> float:
    loader = TensorLoader(images, labels, batch_size, shuffle=True, augment=True, num_replicas=1, rank=0,
                          mean=CIFAR10_MEAN, std=CIFAR10_STD, **kw)
    return time_passes(lambda: loader, epochs, images.shape[0])


def airbench_style(images, labels, batch_size: int, epochs: int) -> float:
    """airbench's batch_crop (a masked copy per shift) and flip, on uint8, then normalise."""

    def batches():
        perm = torch.randperm(images.shape[0])
        for i in range(0, len(perm), batch_size):
            x = F.pad(images[perm[i:i + batch_size]], (4, 4, 4, 4))
            n = len(x)
            shifts = torch.randint(0, 9, (n, 2))
            rows = torch.empty((n, 3, 32, 40), dtype=x.dtype)
            for s in range(9):
                m = shifts[:, 0] == s
                rows[m] = x[m, :, s:s + 32, :]
            out = torch.empty((n, 3, 32, 32), dtype=x.dtype)
            for s in range(9):
                m = shifts[:, 1] == s
                out[m] = rows[m, :, :, s:s + 32]
            out = torch.where((torch.rand(n) < 0.5).view(n, 1, 1, 1), out.flip(3), out)
            yield normalize(out), labels[perm[i:i + batch_size]]

    return time_passes(batches, epochs, images.shape[0])


def atomic_write_json(path: str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=10000, help="images per epoch")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=3, help="timed passes per pipeline (after one warm-up pass)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers of the peer")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the batched pipelines "
                   "(default: torch's, i.e. all cores, as the peer's workers use all cores)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "input_pipeline.json"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    images, labels = SyntheticCifar10(mode="train", size=args.size).as_tensors()
    peer = torchvision_peer(args.size, args.batch_size, args.epochs, args.workers)
    rows = [
        (f"torchvision per-sample DataLoader (num_workers={args.workers})", peer),
        ("fleetlite TensorLoader (crop+flip+normalise)", tensor_loader(images, labels, args.batch_size, args.epochs)),
        ("fleetlite TensorLoader, channels_last", tensor_loader(images, labels, args.batch_size, args.epochs,
                                                                channels_last=True)),
        ("airbench-style masked crop + flip (reference)", airbench_style(images, labels, args.batch_size,
                                                                         args.epochs)),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\ninput pipeline, {args.size} images/epoch, batch {args.batch_size}, {args.epochs} timed epochs, "
          f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs")
    print(f"{'pipeline':<{width}}  {'images/s':>10}  {'vs peer':>8}")
    for name, ips in rows:
        print(f"{name:<{width}}  {ips:>10.0f}  {ips / peer:>7.2f}x")
    ratio = rows[1][1] / peer
    print(f"TensorLoader / peer = {ratio:.2f}x (target >= {TARGET:.0f}x): {'met' if ratio >= TARGET else 'NOT met'}")
    result = {
        "benchmark": "input_pipeline",
        "config": vars(args) | {"torch_threads": torch.get_num_threads(), "cpus": os.cpu_count()},
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__},
        "peer": rows[0][0],
        "results": [{"pipeline": n, "images_per_s": round(v, 1), "ratio_vs_peer": round(v / peer, 3)}
                    for n, v in rows],
        "target_ratio": TARGET,
        "target_met": ratio >= TARGET,
    }
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
