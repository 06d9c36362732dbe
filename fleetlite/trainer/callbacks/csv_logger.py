"""``CSVLogger``: one CSV row per epoch, rewritten atomically on rank 0. Public through :mod:`fleetlite.callbacks`."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from ...utils.atomic import atomic_write_text
from .base import Callback, is_rank_zero, to_python

__all__ = ["CSVLogger"]


class CSVLogger(Callback):
    """One CSV row per epoch (epoch, then every epoch log value), rewritten atomically on rank 0.

    ``filename`` is relative to the run directory: ``fit(save_dir=...)`` when
    given, else the current directory (Hydra's run directory in recipes).

    Example::

        trainer.fit(data, eval_data=val, epochs=5, save_dir="runs/a", callbacks=[CSVLogger()])
        # runs/a/training.csv: epoch,acc,loss,val_acc,val_loss
    """

    def __init__(self, filename: str = "training.csv", separator: str = ",", append: bool = False) -> None:
        super().__init__()
        self.filename = filename
        self.separator = separator
        self.append = append
        self.rows: list[dict[str, Any]] = []
        self.path: Path | None = None

    def on_train_begin(self, logs=None):
        base = self.trainer.run_dir if self.trainer is not None else Path.cwd()
        self.path = Path(base) / self.filename
        if self.append and self.path.exists() and not self.rows:
            with open(self.path, newline="", encoding="utf-8") as f:
                self.rows = [dict(r) for r in csv.DictReader(f, delimiter=self.separator)]
        elif not self.append:
            self.rows = []

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": epoch}
        row.update({k: to_python(v) for k, v in sorted((logs or {}).items())})
        self.rows.append(row)
        if is_rank_zero() and self.path is not None:
            keys: list[str] = []
            for r in self.rows:
                keys.extend(k for k in r if k not in keys)
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=keys, delimiter=self.separator, lineterminator="\n")
            writer.writeheader()
            writer.writerows(self.rows)
            atomic_write_text(self.path, buf.getvalue())

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [dict(r) for r in self.rows]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = [dict(r) for r in state["rows"]]
