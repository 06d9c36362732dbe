"""The run log (``<run_dir>/<recipe>.log``): epoch metrics and full tracebacks, while the terminal stays short.

Hydra's job logging writes records to the console and to the run log. The
terminal already gets the progress bar and, on failure, one ``error:`` line;
the run log gets what one needs afterwards: a line per epoch with every
metric (:class:`EpochLog`) and the full traceback of a failure
(:func:`log_failure`). Both go to the file only. Ranks other than 0 have no
Hydra logging (only rank 0 writes into the run directory); a failure there
is appended to the same file, marked with its rank.

Example::

    callbacks.append(EpochLog())
    try:
        train(cfg)
    except Exception as e:
        fail(f"{type(e).__name__}: {e} (traceback in {log_failure(e)})", status=1, every_rank=True)
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from fleetlite.callbacks import Callback
from fleetlite.trainer.callbacks.progress import epoch_label, format_logs

__all__ = ["EpochLog", "log_failure", "run_log_path"]

_LOGGER = "fleetlite.run"


def run_log_path() -> Path | None:
    """``<run_dir>/<job name>.log`` of the running Hydra job (None outside one)."""
    try:
        from hydra.core.hydra_config import HydraConfig  # hydra: heavy, only inside a recipe's Hydra job

        hc = HydraConfig.get()
        return Path(hc.runtime.output_dir) / f"{hc.job.name}.log"
    except Exception:  # noqa: BLE001 - not inside a Hydra job
        return None


def _file_logger() -> logging.Logger:
    """A logger writing to the run log only: the root logger's file handlers (Hydra's), not the console."""
    log = logging.getLogger(_LOGGER)
    log.propagate = False
    log.setLevel(logging.INFO)
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    log.handlers = files or [logging.NullHandler()]
    return log


class EpochLog(Callback):
    """One line per epoch in the run log: ``Epoch 3/9: loss=... acc=... val_loss=... val_acc=...``.

    Epochs are numbered from 0, as everywhere in fleetlite (the progress bar, metrics.csv, checkpoint names).

    Example::

        trainer.fit(data, epochs=3, callbacks=[EpochLog()])
    """

    def on_train_begin(self, logs=None):
        self._log = _file_logger()
        self._log.info("training: %s epochs, %s steps per epoch, %s rank(s), resumed at optimizer step %s",
                       self.params.get("epochs"), self.params.get("steps"), self.params.get("world_size"),
                       self.trainer.global_step)

    def on_epoch_end(self, epoch, logs=None):
        values = format_logs(logs).replace(": ", "=").replace(" - ", " ")
        self._log.info("%s: %s", epoch_label(epoch, self.params.get("epochs")), values)

    def on_train_end(self, logs=None):
        self._log.info("training ended at optimizer step %s", self.trainer.global_step)


def log_failure(exc: BaseException, rank: int = 0) -> Path | None:
    """Write ``exc``'s full traceback to the run log; returns the log's path (None when there is none)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    path = run_log_path()
    if rank == 0:
        log = _file_logger()
        if not isinstance(log.handlers[0], logging.NullHandler):
            log.error("failed:\n%s", text.rstrip())
            for h in log.handlers:
                h.flush()
            return path
    if path is None:
        return None
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"[rank {rank}] failed:\n{text}")
    except OSError:
        return None
    return path
