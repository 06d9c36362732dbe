"""``ModelCheckpoint``: full training-state checkpoints every N epochs or steps, keep-last-k, best, latest.

# Note [checkpoint timing]
A checkpoint must hold the state *after* every callback has handled the
event (an LR scheduler stepped at the epoch end, EarlyStopping's counters,
...). So ``ModelCheckpoint`` only decides in its hook and asks the Trainer
(``trainer.request_save(fn)``); the Trainer runs the request once all
callbacks of that hook returned, at an optimizer-step boundary. Anything else
that needs a checkpoint at the next step boundary (e.g. a pre-emption
handler) uses the same ``request_save``.

Public through :mod:`fleetlite.trainer.callbacks` (Paddle's ``ModelCheckpoint`` is :mod:`fleetlite.callbacks`').
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ...checkpoint import CheckpointError, atomic_alias, probe_writable, remove_stale
from ...distributed import collective
from ...utils.atomic import atomic_write_text
from ...utils.user_warning import warn_user
from .base import Callback, is_rank_zero
from .monitor import MonitorMixin, missing_monitor, resolve_mode

__all__ = ["ModelCheckpoint"]


class ModelCheckpoint(MonitorMixin, Callback):
    """Save the full training state: every ``save_freq`` epochs and/or every ``save_steps`` optimizer steps.

    Files in ``save_dir`` (default: ``fit(save_dir=...)``): ``epoch-0003.pt``
    (after epoch 3, 0-based), ``step-00000500.pt`` (after optimizer step 500),
    ``latest.pt`` (always the newest, a hard link) and with ``monitor``
    ``best.pt`` (the epoch with the best monitored value by ``mode``). With
    ``keep_last=k`` only the newest k periodic files are kept (``best.pt``
    and ``latest.pt`` stay). Resume with ``fit(..., resume="latest")``.

    Sharded checkpoints (:mod:`fleetlite.checkpoint`, torch DCP) are
    directories (``step-00000500/``, ``latest`` names the newest): used when
    the model is sharded (stage 2/3), with ``async_save=True`` (any strategy:
    the state is staged and written in the background while training goes on,
    at most one save in flight, the last one waited for at the end of
    training), or with ``sharded=True``.

    ``save_top_k=k`` (keyword, with ``monitor``) keeps ``top-epoch-NNNN.pt`` for the k best epochs (``top-epoch-NNNN/``
    directories when the run checkpoints to DCP directories).

    Works under either face. Paddle's ``ModelCheckpoint(save_freq=1, save_dir=None)`` (``Model.save`` files
    ``{save_dir}/{epoch}.pdparams``) is :class:`fleetlite.callbacks.ModelCheckpoint`.

    Example::

        ckpt = ModelCheckpoint("runs/a", save_freq=1, save_steps=200, keep_last=3, monitor="val_acc")
        trainer.fit(data, eval_data=val, epochs=10, callbacks=[ckpt])
        trainer.fit(data, eval_data=val, epochs=10, callbacks=[ckpt], resume="latest")  # after a crash
    """

    def __init__(self, save_dir: str | None = None, save_freq: int | None = 1, save_steps: int | None = None,
                 keep_last: int | None = None, monitor: str | None = None, mode: str = "auto",
                 min_delta: float = 0.0, save_last: bool = True, verbose: int = 0, async_save: bool = False,
                 sharded: bool | None = None, *, save_top_k: int | None = None) -> None:
        super().__init__()
        if save_top_k is not None and (not isinstance(save_top_k, int) or save_top_k < 1 or monitor is None):
            raise ValueError(f"ModelCheckpoint(save_top_k={save_top_k!r}) needs a positive integer and a monitor")
        self.save_top_k = save_top_k
        self.top_k: list[tuple[float, str]] = []  # (value, file) of the kept best epochs, best first
        if isinstance(save_dir, int) and not isinstance(save_dir, bool):
            raise TypeError(f"ModelCheckpoint(save_dir={save_dir!r}): the Trainer's ModelCheckpoint takes the "
                            "directory first; Paddle's ModelCheckpoint(save_freq, save_dir) is "
                            "fleetlite.callbacks.ModelCheckpoint")
        for name, v in (("save_freq", save_freq), ("save_steps", save_steps), ("keep_last", keep_last)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"ModelCheckpoint({name}={v!r}) must be a positive integer or None")
        self.save_dir = save_dir
        self.save_freq = save_freq
        self.save_steps = save_steps
        self.keep_last = keep_last
        self.monitor = monitor
        self.mode = resolve_mode(mode, monitor) if monitor else "min"
        self.min_delta = abs(float(min_delta))
        self.save_last = save_last
        self.verbose = verbose
        self.saved: list[str] = []
        self.held: list[str] = []  # periodic checkpoint directories past keep_last, kept while they are the best
        self.best_dir: str | None = None  # the directory ``best`` names (a run that checkpoints to directories)
        self.best: float | None = None
        self.best_epoch: int | None = None
        self._last_saved_step: int | None = None
        self.directory: Path | None = None
        self.async_save = bool(async_save)
        self.sharded = sharded
        self._in_flight = None  # the PendingSave of an asynchronous save
        self._warned = False

    # -- decisions (in the hooks) -------------------------------------------------
    def on_train_begin(self, logs=None):
        d = self.save_dir or getattr(self.trainer, "save_dir", None)
        if d is None:
            raise ValueError("ModelCheckpoint has no directory: pass ModelCheckpoint(save_dir=...) or "
                             "fit(..., save_dir=...)")
        self.directory = Path(d)
        if self.sharded is False and self.trainer.checkpoint_connector.layout.partial:
            raise ValueError("ModelCheckpoint(sharded=False) asks for single checkpoint files, but a tensor- or "
                             "pipeline-parallel model checkpoints to DCP directories (each rank writes its slices "
                             "and stage; they reshard on load); drop sharded=False")
        # a resumed run starts from a saved step: a finished run resumed saves nothing new (nothing changed)
        self._last_saved_step = self.trainer.global_step
        self._check_directory()

    def _check_directory(self) -> None:
        """Fail now, on every rank, when rank 0 cannot write the directory; drop temporary files of dead saves."""
        error = None
        if is_rank_zero():
            try:
                probe_writable(self.directory)
                remove_stale(self.directory)
            except CheckpointError as e:
                error = str(e)
        if collective.is_initialized():
            error = collective.all_gather_object(error)[0]
        if error is not None:
            raise CheckpointError(None, error)

    def on_train_batch_end(self, step, logs=None):
        t = self.trainer
        if self.save_steps and t.at_step_boundary and t.global_step % self.save_steps == 0:
            self._request(f"step-{t.global_step:08d}.pt", best=False)

    def on_epoch_end(self, epoch, logs=None):
        best = False
        if self.monitor is not None and not self._warned and missing_monitor(self.monitor, logs, self.params):
            self._warned = True
            warn_user(f"ModelCheckpoint: monitor {self.monitor!r} is not in the epoch logs (available: "
                      f"{sorted(logs or {})}), so best.pt is never written; pass one of those, or eval_data "
                      "to fit for val_* values")
        if self.monitor is not None and logs and self.monitor in logs:
            value = float(logs[self.monitor])
            if self._improves(value, self.best, self.mode):
                self.best, self.best_epoch, best = value, epoch, True
            if self.save_top_k:
                self._keep_top_k(epoch, value)
        periodic = bool(self.save_freq) and (epoch + 1) % self.save_freq == 0
        if periodic or best:
            self._request(f"epoch-{epoch:04d}.pt" if periodic else "best.pt", best=best, periodic=periodic)

    def _keep_top_k(self, epoch: int, value: float) -> None:
        """Lightning's ``save_top_k``: the k best epochs by ``monitor``/``mode``, as ``top-epoch-NNNN.pt`` files or,
        in a run that checkpoints to DCP directories, ``top-epoch-NNNN/`` directories."""
        dcp = self._dcp()
        name = f"top-epoch-{epoch:04d}" + ("" if dcp else ".pt")
        ranked = sorted(self.top_k + [(value, name)], key=lambda vn: vn[0], reverse=self.mode == "max")
        kept, dropped = ranked[: self.save_top_k], ranked[self.save_top_k:]
        self.top_k = kept
        if (value, name) in kept:
            path, old = self.directory / name, tuple(self.directory / n for _, n in dropped)

            def write():
                if dcp:
                    self._finish()  # at most one save in flight
                    self.trainer.checkpoint_connector.save_sharded(path, latest=False, async_save=False)
                else:
                    self.trainer.save_checkpoint(path)
                if is_rank_zero():
                    for f in old:
                        if f.is_dir():
                            shutil.rmtree(f, ignore_errors=True)
                        else:
                            f.unlink(missing_ok=True)

            self.trainer.request_save(write)

    def on_train_end(self, logs=None):
        t = self.trainer
        if getattr(t, "terminated_on_nan", None) is not None:
            return  # TerminateOnNaN: the weights are broken; the last good checkpoint stays latest
        if self.save_last and self._last_saved_step != t.global_step and t.global_step > 0:
            name = f"epoch-{t.epoch:04d}.pt" if t.epoch_finished else f"step-{t.global_step:08d}.pt"
            self._request(name, best=False)
            t.run_pending_saves()
        self.wait()

    def wait(self) -> None:
        """Finish the asynchronous save in flight, if any (collective); then apply ``keep_last``."""
        self._finish()
        if self.directory is not None and self._dcp():
            self._prune(0)

    def _finish(self) -> None:
        pending, self._in_flight = self._in_flight, None
        if pending is not None:
            pending.wait()

    def _dcp(self) -> bool:
        if self.sharded is not None:
            return bool(self.sharded)
        return self.async_save or self.trainer.parallel_network.is_sharded  # hybrid models are is_sharded too

    def _request(self, name: str, best: bool, periodic: bool = True) -> None:
        if periodic and name not in self.saved:
            self.saved.append(name)
        self._last_saved_step = self.trainer.global_step
        self.trainer.request_save(lambda: self._write(name, best, periodic))

    # -- writing (run by the Trainer after all callbacks, see Note [checkpoint timing]) ----
    def _write(self, name: str, best: bool, periodic: bool) -> None:
        if self._dcp():
            return self._write_dcp(name, best, periodic)
        path = self.directory / name
        self.trainer.save_checkpoint(path, latest=True)
        rank0 = is_rank_zero()
        if rank0 and best and name != "best.pt":
            atomic_alias(path, self.directory / "best.pt")
        if rank0 and self.verbose:
            print(f"saved checkpoint {path}" + (" (best)" if best else ""))
        if periodic and self.keep_last is not None:
            while len(self.saved) > self.keep_last:  # every rank keeps the same list; rank 0 deletes
                old = self.directory / self.saved.pop(0)
                if rank0:
                    old.unlink(missing_ok=True)

    def _write_dcp(self, name: str, best: bool, periodic: bool) -> None:
        self._finish()  # at most one save in flight; it commits before the next starts
        # the new name is already listed: an async save keeps one more until it has committed
        self._prune(1 if self.async_save and periodic else 0)
        folder = name[:-3] if name.endswith(".pt") else name
        rank0 = is_rank_zero()
        if best:  # (after the prune above, so the former best goes only once this one is written; saved in its state)
            self.best_dir = folder
        pending = self.trainer.checkpoint_connector.save_sharded(self.directory / folder, latest=True,
                                                                 async_save=self.async_save)
        self._in_flight = pending if self.async_save else None
        if rank0 and best and folder != "best":
            atomic_write_text(self.directory / "best", folder)
        if rank0 and self.verbose:
            print(f"saving checkpoint {self.directory / folder}" + (" (best)" if best else ""))
        if not self.async_save:
            self._prune(0)

    def _prune(self, extra: int) -> None:
        """Delete the oldest periodic checkpoint directories beyond ``keep_last`` (+ ``extra``) and every former best
        among them: what stays is the newest ``keep_last`` and the current best, as in the file form (where
        ``best.pt`` is a link of its own). Runs only when no save is in flight, so a new best has committed before
        the former one goes."""
        if self.keep_last is None:
            return
        while len(self.saved) > self.keep_last + extra:  # every rank keeps the same lists; rank 0 deletes
            old = self.saved.pop(0)
            self.held.append(old[:-3] if old.endswith(".pt") else old)
        kept = [name for name in self.held if name == self.best_dir]
        if is_rank_zero():
            for name in self.held:
                if name not in kept:
                    shutil.rmtree(self.directory / name, ignore_errors=True)
        self.held = kept

    def state_dict(self) -> dict[str, Any]:
        return {"saved": list(self.saved), "best": self.best, "best_epoch": self.best_epoch,
                "top_k": [list(vn) for vn in self.top_k], "held": list(self.held), "best_dir": self.best_dir}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved = list(state["saved"])
        self.best = state["best"]
        self.best_epoch = state["best_epoch"]
        self.top_k = [tuple(vn) for vn in state.get("top_k", [])]
        self.held = list(state.get("held", []))
        epoch = state["best_epoch"]  # (a checkpoint from before best_dir was kept: its best epoch's directory)
        self.best_dir = state.get("best_dir", None if epoch is None else f"epoch-{epoch:04d}")
