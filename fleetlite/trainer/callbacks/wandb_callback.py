"""``WandbCallback``: the run logged to Weights & Biases on rank 0 (Note [tracker callbacks] in :mod:`.tracker`).

Public through :mod:`fleetlite.callbacks`. Needs the optional ``wandb`` package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...utils.weights import require
from .tracker import Tracker, numeric_logs

__all__ = ["WandbCallback"]


class WandbCallback(Tracker):
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
            self.run.summary.update(numeric_logs(logs))
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
        self.run = None
