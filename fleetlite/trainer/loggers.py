"""Experiment trackers as callbacks: :class:`MLflowLogger`, :class:`WandbCallback` (Paddle's name), and
:class:`LearningRateMonitor`, which puts the learning rates into the logs every logger reads.

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

import math
import os
import tempfile
from pathlib import Path
from typing import Any

from .callback_base import Callback, History, is_rank_zero
from .export import require

__all__ = ["LearningRateMonitor", "MLflowLogger", "WandbCallback", "flatten_config", "learning_rates"]


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


def learning_rates(optimizer) -> dict[str, float]:
    """``{"lr": x}`` for one param group, ``{"lr/pg0": x, "lr/pg1": y, ...}`` for several."""
    groups = getattr(optimizer, "param_groups", None) or []
    lrs = [float(g["lr"]) for g in groups]
    if len(lrs) == 1:
        return {"lr": lrs[0]}
    return {f"lr/pg{i}": v for i, v in enumerate(lrs)}


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


def _numeric(logs: dict[str, Any] | None) -> dict[str, float]:
    out = {}
    for k, v in (logs or {}).items():
        if k in ("batch_size", "outputs"):
            continue
        p = _plain(v)
        if p is not None:
            out[k] = p
    return out


class LearningRateMonitor(Callback):
    """Adds the optimizer's learning rate of each param group to the logs (``lr`` or ``lr/pg<i>``).

    ``logging_interval``: ``"step"`` (every optimizer step's batch logs, and the epoch logs) or ``"epoch"``
    (epoch logs only). ``fit`` runs it before the other callbacks so every logger (CSVLogger, TensorBoard,
    MLflowLogger, WandbCallback, History) records the rate; the value is the rate the step just used.

    Example::

        trainer.fit(data, epochs=5, callbacks=[LearningRateMonitor(), LRScheduler(sched), CSVLogger()])
    """

    def __init__(self, logging_interval: str = "step") -> None:
        super().__init__()
        if logging_interval not in ("step", "epoch"):
            raise ValueError(f"LearningRateMonitor(logging_interval={logging_interval!r}): use 'step' or 'epoch'")
        self.logging_interval = logging_interval

    def _lrs(self) -> dict[str, float]:
        return learning_rates(self.trainer.optimizer) if self.trainer.optimizer is not None else {}

    def on_train_batch_begin(self, step, logs=None):
        # read before the step: a per-step scheduler may move the rate when the step ends, and the value
        # logged is the rate this step used (the last rate of a cosine run is never used: it is 0)
        self._used = self._lrs()

    def on_train_batch_end(self, step, logs=None):
        if self.logging_interval == "step" and logs is not None:
            logs.update(getattr(self, "_used", None) or self._lrs())

    def on_epoch_end(self, epoch, logs=None):
        # the rate the epoch's last step used (read from the optimizer, so a resumed run logs what the
        # uninterrupted one did); before a per-epoch LRScheduler steps (this callback runs first)
        if logs is not None:
            logs.update(getattr(self, "_used", None) or self._lrs())


class _Tracker(Callback):
    """Shared life cycle of the tracker callbacks (Note [tracker callbacks])."""

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
        self._log({f"batch/{k}": v for k, v in _numeric(logs).items()}, t.global_step)

    def on_epoch_end(self, epoch, logs=None):
        if self._ensure_open():
            self._log(_numeric(logs), epoch)

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
        from ..utils.plot import matplotlib_available, plot_training_curves

        if not matplotlib_available():
            return None
        import csv

        keys = sorted(hist.history)
        csv_path = directory / "metrics.csv"
        with open(csv_path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["epoch", *keys])
            for i, e in enumerate(hist.epoch):
                w.writerow([e, *(hist.history[k][i] if i < len(hist.history[k]) else "" for k in keys)])
        return plot_training_curves(csv_path, directory / "training_curves.png")

    def _final_checkpoint(self) -> str | None:
        from .model_checkpoint import ModelCheckpoint

        cbs = getattr(self.trainer, "_callbacks", None)
        for cb in cbs.find(ModelCheckpoint) if cbs is not None else []:
            d = Path(cb.save_dir) if getattr(cb, "save_dir", None) else None
            if d is not None:
                for name in ("final.pt", "latest.pt"):
                    if (d / name).exists():
                        return str((d / name).resolve())
        return None


class MLflowLogger(_Tracker):
    """Log the run to MLflow (rank 0): params = the flattened config, metrics per step and epoch, artifacts.

    ``tracking_uri``: any MLflow URI; default ``$MLFLOW_TRACKING_URI``, else the local file store
    ``<run dir>/mlruns`` (nothing leaves the machine). At the end the training-curves PNG and a text
    file with the final checkpoint's path are logged as artifacts; an exception marks the run FAILED.
    Needs ``pip install 'fleetlite[mlflow]'`` (mlflow-skinny).

    Example::

        trainer.fit(data, epochs=3, save_dir="runs/a", callbacks=[MLflowLogger(experiment_name="cifar")])
        import mlflow
        run = mlflow.MlflowClient("runs/a/mlruns").search_runs(["0"])[0]
    """

    def __init__(self, experiment_name: str = "fleetlite", run_name: str | None = None,
                 tracking_uri: str | None = None, tags: dict[str, str] | None = None, log_freq: int | None = None,
                 log_artifacts: bool = True) -> None:
        super().__init__(log_freq)
        self._mlflow = require("mlflow", "MLflowLogger")
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tracking_uri = tracking_uri
        self.tags = dict(tags or {})
        self.log_artifacts = log_artifacts
        self.client = None

    def _uri(self) -> str:
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri and not uri.startswith("file:") and "://" not in uri and not os.path.isabs(uri):
            uri = None if not uri else Path(uri).resolve().as_uri()  # a relative directory: a file store
        uri = uri or (Path(self.trainer.run_dir).resolve() / "mlruns").as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps the file store in maintenance mode behind this documented opt-out; it is the one
            # backend mlflow-skinny serves without a database (pass a sqlite:// or http:// URI for others)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        return uri

    def _start(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self.tracking_uri = self._uri()
        self.client = self._mlflow.MlflowClient(tracking_uri=self.tracking_uri)
        if self.run_id is not None:  # a resumed fit continues its run (Note [tracker callbacks])
            self.client.update_run(self.run_id, status="RUNNING")
            return
        exp = self.client.get_experiment_by_name(self.experiment_name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.experiment_name)
        run = self.client.create_run(exp_id, run_name=self.run_name, tags=self.tags)
        self.run_id = run.info.run_id
        items = [Param(k[:250], str(v)[:6000]) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if not metrics:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, int(step)) for k, v in metrics.items()])

    def _finish(self, status: str, logs: dict[str, Any]) -> None:
        if status == "FINISHED" and self.log_artifacts:
            with tempfile.TemporaryDirectory() as d:
                png = self._curves_png(Path(d))
                if png is not None:
                    self.client.log_artifact(self.run_id, str(png))
            ckpt = self._final_checkpoint()
            if ckpt is not None:
                self.client.set_tag(self.run_id, "final_checkpoint", ckpt)
                self.client.log_text(self.run_id, ckpt + "\n", "final_checkpoint.txt")
        self.client.set_terminated(self.run_id, status=status)


class WandbCallback(_Tracker):
    """Log the run to Weights & Biases (rank 0), Paddle's ``paddle.callbacks.WandbCallback``.

    ``mode`` defaults to ``$WANDB_MODE``, else ``"offline"``: the run is written under
    ``<dir>/wandb/offline-run-*`` and sent only by ``wandb sync``; pass ``mode="online"`` to stream it.
    ``dir`` defaults to the run directory. Config, metrics (as in Note [tracker callbacks]) and the
    summary (the last epoch's values) are logged. Needs ``pip install 'fleetlite[wandb]'``.

    Example::

        trainer.fit(data, epochs=3, save_dir="runs/a", callbacks=[WandbCallback(project="cifar")])
    """

    def __init__(self, project: str | None = None, entity: str | None = None, name: str | None = None,
                 dir: str | None = None, mode: str | None = None, job_type: str | None = None,
                 log_freq: int | None = None, **kwargs: Any) -> None:
        super().__init__(log_freq)
        self._wandb = require("wandb", "WandbCallback")
        self.project = project or "fleetlite"
        self.entity, self.name, self.dir, self.job_type = entity, name, dir, job_type
        self.mode = mode or os.environ.get("WANDB_MODE") or "offline"
        self.kwargs = kwargs
        self.run = None

    def _start(self, params: dict[str, Any]) -> None:
        directory = Path(self.dir or self.trainer.run_dir)
        directory.mkdir(parents=True, exist_ok=True)
        resume = {"id": self.run_id, "resume": "allow"} if self.run_id else {}
        self.run = self._wandb.init(project=self.project, entity=self.entity, name=self.name, dir=str(directory),
                                    mode=self.mode, job_type=self.job_type, config=params, reinit="finish_previous",
                                    **resume, **self.kwargs)
        self.run_id = self.run.id
        self.run.define_metric("batch/*", step_metric="global_step")
        self.run.define_metric("*", step_metric="epoch")

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if not metrics:
            return
        key = "global_step" if next(iter(metrics)).startswith("batch/") else "epoch"
        self.run.log({**metrics, key: step})

    def _finish(self, status: str, logs: dict[str, Any]) -> None:
        if status == "FINISHED":
            self.run.summary.update(_numeric(logs))
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
        self.run = None
