"""The training-curves figure of a run: loss and accuracy per epoch, train and validation, from metrics.csv.

matplotlib is an optional extra (``pip install 'fleetlite[plot]'``): without it
:func:`plot_training_curves` returns None and :func:`missing_note` says so in one line.

Example::

    from fleetlite.recipe.plot import plot_training_curves
    png = plot_training_curves("outputs/run/metrics.csv", "outputs/run/training_curves.png")
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
from pathlib import Path

from ..utils.atomic import atomic_open

__all__ = ["plot_training_curves", "read_metrics", "matplotlib_available", "missing_note"]

# (panel title, train column candidates, validation column candidates)
_PANELS = (("loss", ("loss", "train_loss"), ("val_loss", "eval_loss")),
           ("accuracy", ("acc", "accuracy", "train_acc"), ("val_acc", "val_accuracy", "eval_acc")))


def matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def missing_note() -> str:
    return "note: matplotlib is not installed, so no training-curves plot; pip install 'fleetlite[plot]' for one"


def read_metrics(csv_path: str | os.PathLike) -> dict[str, list[float]]:
    """Columns of a metrics CSV as float lists (empty cells become NaN)."""
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    cols: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            try:
                num = float(value) if value not in (None, "") else math.nan
            except ValueError:
                num = math.nan
            cols.setdefault(key, []).append(num)
    return cols


def _pick(cols: dict[str, list[float]], names: tuple[str, ...]) -> list[float] | None:
    for n in names:
        if n in cols and any(not math.isnan(v) for v in cols[n]):
            return cols[n]
    return None


def plot_training_curves(csv_path: str | os.PathLike, png_path: str | os.PathLike, title: str = "") -> Path | None:
    """Draw loss and accuracy per epoch (train and validation) into ``png_path``, written atomically.

    Returns the PNG's path, or None when matplotlib is missing or the CSV has
    no epoch rows. Validation points appear at the epochs that were evaluated.
    """
    if not matplotlib_available():
        return None
    cols = read_metrics(csv_path)
    epochs = cols.get("epoch")
    if not epochs:
        return None
    import matplotlib  # matplotlib: optional (fleetlite[plot]) and slow to import

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    xs = list(epochs)  # numbered from 0, as in metrics.csv, checkpoint names and the progress bar
    fig = Figure(figsize=(10, 4), dpi=100)
    for i, (name, train_keys, val_keys) in enumerate(_PANELS):
        ax = fig.add_subplot(1, 2, i + 1)
        for label, keys, style in (("train", train_keys, "-o"), ("validation", val_keys, "-s")):
            ys = _pick(cols, keys)
            if ys is None:
                continue
            pts = [(x, y) for x, y in zip(xs, ys) if not math.isnan(y)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, markersize=3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.set_title(name)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(png_path, "wb") as f:  # Note [atomic write]
        fig.savefig(f, format="png")
    return png_path
