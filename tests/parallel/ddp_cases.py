"""Shared helpers for the drop-in tests: one case under torch DDP and under fleetlite.DistributedDataParallel."""

import torch
from models import DeepMLP as MLP  # noqa: F401  (MLP(depth, width))
from torch.nn.parallel import DistributedDataParallel as DDP

import fleetlite


def wrap(engine, model, **kw):
    if engine == "ddp":
        return DDP(model, **kw)
    return fleetlite.DistributedDataParallel(model, **kw)


def snapshot(model):
    """Parameters and gradients (``None`` kept) by name."""
    return {n: (p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
            for n, p in model.named_parameters()}


def both(rank, world, case, *args):
    """Run ``case(rank, engine, *args)`` for torch DDP, then fleetlite, in the same two processes."""
    return {engine: case(rank, engine, *args) for engine in ("ddp", "fleetlite")}


def assert_same(got, ref, atol=1e-6, msg=""):
    """Equal nested results; ``None`` gradients must be ``None`` on both sides."""
    if isinstance(ref, dict):
        assert set(got) == set(ref), (msg, set(got) ^ set(ref))
        for k in ref:
            assert_same(got[k], ref[k], atol, f"{msg}/{k}")
    elif isinstance(ref, (list, tuple)):
        assert len(got) == len(ref), msg
        for i, (a, b) in enumerate(zip(got, ref)):
            assert_same(a, b, atol, f"{msg}[{i}]")
    elif ref is None or got is None:
        assert got is None and ref is None, f"{msg}: fleetlite {type(got).__name__}, DDP {type(ref).__name__}"
    elif isinstance(ref, torch.Tensor):
        torch.testing.assert_close(got, ref, rtol=0, atol=atol, msg=msg)
    else:
        assert got == ref, (msg, got, ref)


def assert_parity(results, atol=1e-6):
    for rank, r in enumerate(results):
        assert_same(r["fleetlite"], r["ddp"], atol, f"rank {rank}")


def batch(step, rank, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1000 * rank + step))
