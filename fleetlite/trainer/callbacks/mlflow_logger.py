"""``MLflowLogger``: the run logged to MLflow on rank 0 (Note [tracker callbacks] in :mod:`.tracker`).

Public through :mod:`fleetlite.callbacks`. Needs the optional ``mlflow`` (``mlflow-skinny``) package.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ...utils.weights import require
from .tracker import Tracker

__all__ = ["MLflowLogger"]


class MLflowLogger(Tracker):
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
        from mlflow.entities import Param  # mlflow is optional: imported once the tracker is in use

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
        from mlflow.entities import Metric  # mlflow is optional (see _start)

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
