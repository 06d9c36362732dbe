"""``Trainer.summary``: parameter counts per layer, rendered with rich on rank 0."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["summarize"]


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
