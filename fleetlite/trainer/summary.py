"""``Trainer.summary`` (parameter counts per layer, rendered with rich on rank 0) and Paddle's ``paddle.summary``
(``fleetlite.summary``: a forward pass with per-layer output shapes)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

__all__ = ["summarize", "summary"]


def summarize(network: nn.Module, print_table: bool = True, console: Any = None) -> dict[str, Any]:
    """Rows ``(name, type, params, trainable)`` for every module that owns parameters, and the totals.

    Each parameter is counted once, at the module that registers it (shared
    parameters are counted at their first owner).

    Example::

        info = summarize(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), print_table=False)
        assert info["total_params"] == 15
    """
    seen: set[int] = set()
    rows = []
    for name, module in network.named_modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        if not own:
            continue
        total = sum(p.numel() for p in own)
        trainable = sum(p.numel() for p in own if p.requires_grad)
        rows.append({"name": name or "(root)", "type": type(module).__name__, "params": total,
                     "trainable": trainable})
    total = sum(r["params"] for r in rows)
    trainable = sum(r["trainable"] for r in rows)
    info = {"total_params": total, "trainable_params": trainable, "non_trainable_params": total - trainable,
            "layers": rows}
    if print_table:
        from ..distributed import collective

        if collective.get_rank() == 0:
            _render(type(network).__name__, info, console)
    return info


def _render(title: str, info: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{title}: {info['total_params']:,} parameters")
    table.add_column("Layer")
    table.add_column("Type")
    table.add_column("Params", justify="right")
    table.add_column("Trainable", justify="right")
    for r in info["layers"]:
        table.add_row(r["name"], r["type"], f"{r['params']:,}", f"{r['trainable']:,}")
    table.add_section()
    table.add_row("Total", "", f"{info['total_params']:,}", f"{info['trainable_params']:,}")
    (console or Console()).print(table)


@contextlib.contextmanager
def probe(net: nn.Module, hooks: list[Any]):
    """An eval-mode, no-grad forward context on the network's device; removes ``hooks`` and restores the mode."""
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            yield next((p.device for p in net.parameters()), torch.device("cpu"))
    finally:
        for h in hooks:
            h.remove()
        net.train(was_training)


# -- Paddle's paddle.summary ------------------------------------------------------------------------------------
def _check_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    out, unknown = [], 0
    for item in shape:
        if item is None or item == -1:
            unknown += 1
            if unknown > 1:
                raise ValueError("Option input_size only the dim of batch_size can be None or -1.")
            item = 1
        elif isinstance(item, bool) or not isinstance(item, int):
            raise TypeError(f"the elements of input_size must be int, None or -1, got {item!r} "
                            f"({type(item).__name__})")
        elif item <= 0:
            raise ValueError(f"Expected element in input size greater than zero, but got {item}")
        out.append(item)
    return tuple(out)


def _is_shape(x: Any) -> bool:
    return isinstance(x, int) or (isinstance(x, (list, tuple)) and all(
        i is None or (not isinstance(i, (list, tuple)) and not hasattr(i, "shape")) for i in x))


def _build(input_size: Any, dtypes: list[Any], device: torch.device) -> Any:
    """Tensors for ``input_size``, nesting kept (a tuple of shapes becomes a tuple of tensors)."""
    if hasattr(input_size, "shape") and not isinstance(input_size, torch.Tensor):  # an InputSpec
        input_size = tuple(input_size.shape)
    if _is_shape(input_size):
        shape = _check_shape(input_size)
        dt = dtypes.pop(0) if len(dtypes) > 1 else (dtypes[0] if dtypes else None)
        dtype = getattr(torch, str(dt or "float32").replace("paddle.", ""))
        if not dtype.is_floating_point:
            return torch.zeros(shape, dtype=dtype, device=device)
        return torch.rand(shape, device=device).to(dtype)
    return type(input_size)(_build(i, dtypes, device) for i in input_size)


def _shape_of(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return list(x.shape)
    if isinstance(x, (list, tuple)):
        shapes = [_shape_of(v) for v in x if isinstance(v, (torch.Tensor, list, tuple))]
        return shapes[0] if len(shapes) == 1 else shapes
    return []


def summary(net: nn.Module, input_size: Any = None, dtypes: Any = None, input: Any = None) -> dict[str, int]:
    """Paddle's ``paddle.summary``: print a per-layer table, return ``{'total_params', 'trainable_params'}``.

    ``input_size``: one shape (``(-1, 3, 32, 32)``; ``None``/``-1`` is the batch dimension, set to 1), an int,
    an InputSpec, or a list of them for several inputs; ``dtypes`` a dtype name or one per input (default
    float32); or ``input``: the tensor(s) to run (passed as one argument). With neither, only parameters are
    counted. Each parameter is counted once (at the first layer that owns it). Printed on rank 0.

    Example::

        info = fleetlite.summary(torch.nn.Sequential(torch.nn.Linear(20, 10)), (-1, 20))
        assert info == {"total_params": 210, "trainable_params": 210}
    """
    from ..distributed import collective

    rows: list[list[Any]] = []
    hooks = []
    seen: set[int] = set()

    def own_params(module: nn.Module) -> tuple[int, int]:
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        return sum(p.numel() for p in own), sum(p.numel() for p in own if p.requires_grad)

    def hook(module, args, output):
        total, _ = own_params(module)
        name = f"{type(module).__name__}-{len(rows) + 1}"
        rows.append([name, _shape_of(list(args)), _shape_of(output), total])

    if input is not None or input_size is not None:
        for m in net.modules():
            if not list(m.children()) or list(m.parameters(recurse=False)):
                hooks.append(m.register_forward_hook(hook))
        with probe(net, hooks) as device:
            if input is not None:
                net(input)
            else:
                names = list(dtypes) if isinstance(dtypes, (list, tuple)) else [dtypes]
                xs = _build(input_size, names, device)
                net(*(xs if isinstance(xs, list) else [xs]))
    total = sum(p.numel() for p in {id(p): p for p in net.parameters()}.values())
    trainable = sum(p.numel() for p in {id(p): p for p in net.parameters()}.values() if p.requires_grad)
    if collective.get_rank() == 0:
        line = "-" * 80
        print(line)
        print(f"{'Layer (type)':>20} {'Input Shape':>20} {'Output Shape':>22} {'Param #':>14}")
        print("=" * 80)
        for name, ins, outs, n in rows:
            print(f"{name:>20} {str(ins):>20} {str(outs):>22} {n:>14,}")
        print("=" * 80)
        print(f"Total params: {total:,}")
        print(f"Trainable params: {trainable:,}")
        print(f"Non-trainable params: {total - trainable:,}")
        print(line)
    return {"total_params": total, "trainable_params": trainable}
