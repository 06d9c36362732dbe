"""``ModelCheckpoint``: full training-state checkpoints every N epochs or steps, keep-last-k, best, latest.

# Note [checkpoint timing]
A checkpoint must hold the state *after* every callback has handled the
event (an LR scheduler stepped at the epoch end, EarlyStopping's counters,
...). So ``ModelCheckpoint`` only decides in its hook and asks the Trainer
(``trainer.request_save(fn)``); the Trainer runs the request once all
callbacks of that hook returned, at an optimizer-step boundary. Anything else
that needs a checkpoint at the next step boundary (e.g. a pre-emption
handler) uses the same ``request_save``.

Public through :mod:`fleetlite.callbacks`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .callback_base import Callback, is_rank_zero
from .early_stopping import resolve_mode

__all__ = ["ModelCheckpoint"]


class ModelCheckpoint(Callback):
    """Save the full training state: every ``save_freq`` epochs and/or every ``save_steps`` optimizer steps.

    Files in ``save_dir`` (default: ``fit(save_dir=...)``): ``epoch-0003.pt``
    (after epoch 3, 0-based), ``step-00000500.pt`` (after optimizer step 500),
    ``latest.pt`` (always the newest, a hard link) and with ``monitor``
    ``best.pt`` (the epoch with the best monitored value by ``mode``). With
    ``keep_last=k`` only the newest k periodic files are kept (``best.pt``
    and ``latest.pt`` stay). Resume with ``fit(..., resume="latest")``.

    ``save_top_k=k`` (keyword, with ``monitor``) keeps ``top-epoch-NNNN.pt`` for the k best epochs.

    Paddle's positional order ``ModelCheckpoint(save_freq, save_dir)`` is recognised (an int first). Under
    ``fleetlite.Model`` it behaves as Paddle's: ``Model.save`` prefixes ``{save_dir}/{epoch}`` when
    ``epoch % save_freq == 0`` and ``{save_dir}/final``, written by rank 0; no directory means no saving.

    Example::

        ckpt = ModelCheckpoint("runs/a", save_freq=1, save_steps=200, keep_last=3, monitor="val_acc")
        trainer.fit(data, eval_data=val, epochs=10, callbacks=[ckpt])
        trainer.fit(data, eval_data=val, epochs=10, callbacks=[ckpt], resume="latest")  # after a crash
    """

    def __init__(self, save_dir: str | None = None, save_freq: int | None = 1, save_steps: int | None = None,
                 keep_last: int | None = None, monitor: str | None = None, mode: str = "auto",
                 min_delta: float = 0.0, save_last: bool = True, verbose: int = 0, *,
                 save_top_k: int | None = None) -> None:
        super().__init__()
        if save_top_k is not None and (not isinstance(save_top_k, int) or save_top_k < 1 or monitor is None):
            raise ValueError(f"ModelCheckpoint(save_top_k={save_top_k!r}) needs a positive integer and a monitor")
        self.save_top_k = save_top_k
        self.top_k: list[tuple[float, str]] = []  # (value, file) of the kept best epochs, best first
        if isinstance(save_dir, int) and not isinstance(save_dir, bool):  # Paddle's order: (save_freq, save_dir)
            save_dir, save_freq = (save_freq if save_freq != 1 else None), save_dir
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
        self.best: float | None = None
        self.best_epoch: int | None = None
        self._last_saved_step: int | None = None
        self.directory: Path | None = None

    # -- decisions (in the hooks) -------------------------------------------------
    def _paddle(self) -> bool:
        """Under ``fleetlite.Model``: Paddle's ModelCheckpoint (``{save_dir}/{epoch}`` and ``final`` prefixes)."""
        return getattr(self.trainer, "_paddle_hapi", False)

    def on_train_begin(self, logs=None):
        if self._paddle():
            return
        d = self.save_dir or getattr(self.trainer, "save_dir", None)
        if d is None:
            raise ValueError("ModelCheckpoint has no directory: pass ModelCheckpoint(save_dir=...) or "
                             "fit(..., save_dir=...)")
        self.directory = Path(d)
        self._last_saved_step = None
        self._check_directory()

    def _check_directory(self) -> None:
        """Fail now, on every rank, when rank 0 cannot write the directory; drop temporary files of dead saves."""
        from ..distributed import collective
        from .checkpoint import CheckpointError, probe_writable, remove_stale_temporaries

        error = None
        if is_rank_zero():
            try:
                probe_writable(self.directory)
                remove_stale_temporaries(self.directory)
            except CheckpointError as e:
                error = str(e)
        if collective.is_initialized():
            error = collective.all_gather_object(error)[0]
        if error is not None:
            raise CheckpointError(None, error)

    def on_train_batch_end(self, step, logs=None):
        t = self.trainer
        if self._paddle():
            return
        if self.save_steps and t.at_step_boundary and t.global_step % self.save_steps == 0:
            self._request(f"step-{t.global_step:08d}.pt", best=False)

    def on_epoch_end(self, epoch, logs=None):
        if self._paddle():
            from .hapi_callbacks import paddle_checkpoint_epoch_end

            return paddle_checkpoint_epoch_end(self, epoch)
        best = False
        if self.monitor is not None and logs and self.monitor in logs:
            value = float(logs[self.monitor])
            if self.best is None or (value < self.best - self.min_delta if self.mode == "min"
                                     else value > self.best + self.min_delta):
                self.best, self.best_epoch, best = value, epoch, True
            if self.save_top_k:
                self._keep_top_k(epoch, value)
        periodic = bool(self.save_freq) and (epoch + 1) % self.save_freq == 0
        if periodic or best:
            self._request(f"epoch-{epoch:04d}.pt" if periodic else "best.pt", best=best, periodic=periodic)

    def _keep_top_k(self, epoch: int, value: float) -> None:
        """Lightning's ``save_top_k``: ``top-epoch-NNNN.pt`` for the k best epochs by ``monitor``/``mode``."""
        name = f"top-epoch-{epoch:04d}.pt"
        ranked = sorted(self.top_k + [(value, name)], key=lambda vn: vn[0], reverse=self.mode == "max")
        kept, dropped = ranked[: self.save_top_k], ranked[self.save_top_k:]
        self.top_k = kept
        if (value, name) in kept:
            path, old = self.directory / name, tuple(self.directory / n for _, n in dropped)

            def write():
                self.trainer.save_checkpoint(path)
                if is_rank_zero():
                    for f in old:
                        f.unlink(missing_ok=True)

            self.trainer.request_save(write)

    def on_train_end(self, logs=None):
        t = self.trainer
        if self._paddle():
            from .hapi_callbacks import paddle_checkpoint_train_end

            return paddle_checkpoint_train_end(self)
        if getattr(t, "terminated_on_nan", None) is not None:
            return  # TerminateOnNaN: the weights are broken; the last good checkpoint stays latest
        if self.save_last and self._last_saved_step != t.global_step and t.global_step > 0:
            name = f"epoch-{t.epoch:04d}.pt" if t.epoch_finished else f"step-{t.global_step:08d}.pt"
            self._request(name, best=False)
            t.run_pending_saves()

    def _request(self, name: str, best: bool, periodic: bool = True) -> None:
        if periodic and name not in self.saved:
            self.saved.append(name)
        self._last_saved_step = self.trainer.global_step
        self.trainer.request_save(lambda: self._write(name, best, periodic))

    # -- writing (run by the Trainer after all callbacks, see Note [checkpoint timing]) ----
    def _write(self, name: str, best: bool, periodic: bool) -> None:
        from .checkpoint import atomic_alias

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

    def state_dict(self) -> dict[str, Any]:
        return {"saved": list(self.saved), "best": self.best, "best_epoch": self.best_epoch,
                "top_k": [list(vn) for vn in self.top_k]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved = list(state["saved"])
        self.best = state["best"]
        self.best_epoch = state["best_epoch"]
        self.top_k = [tuple(vn) for vn in state.get("top_k", [])]
