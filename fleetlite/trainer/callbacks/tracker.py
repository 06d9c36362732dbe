"""The shared base of the experiment-tracker callbacks (:class:`MLflowLogger`, :class:`WandbCallback`).

# Note [tracker callbacks]
Trackers run on rank 0 only (epoch logs are already reduced over all ranks; per-batch logs are rank 0's
running values). The run's config (``Trainer(config=...)``, flattened to ``a.b.c`` keys) is logged once,
when the run opens. Per-step values go out every ``log_freq`` optimizer steps as ``batch/<name>`` with the
global step; epoch values under their own names with the epoch as the step. The tracker's run id is part
of the callback's checkpointed state, so ``fit(resume=...)`` continues the same run. An exception in fit
marks the run FAILED (KILLED on Ctrl-C) and re-raises.

Example::

    from fleetlite.callbacks import LearningRateMonitor, MLflowLogger
    trainer.fit(data, epochs=3, save_dir="runs/a", callbacks=[LearningRateMonitor(), MLflowLogger()])
    # runs/a/mlruns: the local MLflow store (mlflow ui --backend-store-uri runs/a/mlruns)
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from ...utils.plot import matplotlib_available, plot_training_curves
from .base import Callback, is_rank_zero
from .history import History
from .model_checkpoint import ModelCheckpoint

__all__ = ["Tracker", "flatten_config", "numeric_logs"]


def flatten_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    out: dict[str, Any] = {}
    if isinstance(config, dict):
        for k, v in config.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(flatten_config(v, key))
            else:
                out[key] = v
    elif config is not None:
        out[prefix or "config"] = config
    return out


def _plain(v: Any) -> float | None:
    if hasattr(v, "item"):
        try:
            v = v.item()
        except (RuntimeError, ValueError):
            return None
    if isinstance(v, (list, tuple)):
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def numeric_logs(logs: dict[str, Any] | None) -> dict[str, float]:
    out = {}
    for k, v in (logs or {}).items():
        if k in ("batch_size", "outputs"):
            continue
        p = _plain(v)
        if p is not None:
            out[k] = p
    return out


class Tracker(Callback):
    """Shared life cycle of the tracker callbacks (Note [tracker callbacks]): subclasses open, log to and close a run.

    Example::

        class PrintTracker(Tracker):
            def _start(self, params): print("config", params)
            def _log(self, metrics, step): print(step, metrics)
            def _finish(self, status, logs): print(status)
    """

    def __init__(self, log_freq: int | None = None) -> None:
        super().__init__()
        self.log_freq = log_freq
        self.run_id: str | None = None
        self._open = False

    # subclasses implement these four
    def _start(self, params: dict[str, Any]) -> None: ...
    def _log(self, metrics: dict[str, float], step: int) -> None: ...
    def _finish(self, status: str, logs: dict[str, Any]) -> None: ...

    def _ensure_open(self) -> bool:
        if not is_rank_zero():
            return False
        if not self._open:
            self._start(flatten_config(self.trainer.config))
            self._open = True
        return True

    def on_train_batch_end(self, step, logs=None):
        t = self.trainer
        freq = int(self.log_freq or self.params.get("log_freq") or 10)
        if not t.at_step_boundary or t.global_step % freq or not self._ensure_open():
            return
        self._log({f"batch/{k}": v for k, v in numeric_logs(logs).items()}, t.global_step)

    def on_epoch_end(self, epoch, logs=None):
        if self._ensure_open():
            self._log(numeric_logs(logs), epoch)

    def on_train_end(self, logs=None):
        if self._open:
            self._finish("FINISHED", logs or {})
            self._open = False

    def on_exception(self, error: BaseException) -> None:
        if self._open:
            self._finish("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED", {})
            self._open = False

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id} if self.run_id else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("run_id") and not self._open:
            self.run_id = state["run_id"]

    # helpers for artifacts
    def _history(self) -> History | None:
        cbs = getattr(self.trainer, "_callbacks", None)
        found = cbs.find(History) if cbs is not None else []
        return found[0] if found else None

    def _curves_png(self, directory: Path) -> Path | None:
        """The training-curves PNG (as the recipe draws it) from this fit's History; None without matplotlib."""
        hist = self._history()
        if hist is None or not hist.epoch:
            return None
        if not matplotlib_available():
            return None
        keys = sorted(hist.history)
        csv_path = directory / "metrics.csv"
        with open(csv_path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["epoch", *keys])
            for i, e in enumerate(hist.epoch):
                w.writerow([e, *(hist.history[k][i] if i < len(hist.history[k]) else "" for k in keys)])
        return plot_training_curves(csv_path, directory / "training_curves.png")

    def _final_checkpoint(self) -> str | None:
        cbs = getattr(self.trainer, "_callbacks", None)
        for cb in cbs.find(ModelCheckpoint) if cbs is not None else []:
            d = Path(cb.save_dir) if getattr(cb, "save_dir", None) else None
            if d is not None:
                for name in ("final.pt", "latest.pt"):
                    if (d / name).exists():
                        return str((d / name).resolve())
        return None
