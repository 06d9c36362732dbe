"""``Preemption``: on SIGTERM or Ctrl-C (SIGINT), every rank stops at the same optimizer step, checkpoints, and
``fit`` returns; a second Ctrl-C stops at once.

# Note [pre-emption agreement]
A scheduler pre-empts a job by sending SIGTERM (torchrun forwards it from the
launcher to every worker; ``--shutdown_timeout``, 30 s by default, later it
sends SIGKILL). The signal reaches the ranks at slightly different moments,
so a rank cannot stop on its own: the others would wait in the next
gradient all-reduce. The ranks agree instead, at "polls" that every rank
makes at the same optimizer-step boundaries (and at each epoch end): a poll
waits for the previous poll's asynchronous all-reduce, long finished while
the steps ran, reads it, and starts the next one on a small gloo group of
the callback's own. The all-reduce (MAX) carries [signal received?, minus
the interval to the next poll]: every rank reads the same answer at the same
boundary, so all stop after the same step, and all agree on when to poll
next. Each rank proposes an interval of ``check_interval_s`` of training
(0.25 s) from its measured step time, and the smallest proposal wins: a
stop comes at most about two intervals after the signal reached every rank
(plus two steps), and the cost is one small CPU all-reduce per interval, not
per step: no device sync, no wait (benchmarks/fault_overhead.py measures
it). At the end of training one blocking all-reduce catches a signal that
came after the last poll, so no rank goes on to more collective work (a
final evaluation) while another exits. One process needs no agreement and
stops at the next boundary.

The stop is ``trainer.stop_training`` (honoured at step boundaries, Note
[epoch end]); the checkpoint is ``ModelCheckpoint``'s ``save_last`` save at
the end of training, or this callback's own save when no such
``ModelCheckpoint`` is in use and a directory is known.
``trainer.preempted`` then names the signal.

Note [second Ctrl-C]
Ctrl-C in a terminal sends SIGINT to the launcher and to every worker (one
process group), and ``fleetlite launch`` forwards the launcher's copy to
the workers, so one key press reaches a worker twice within milliseconds.
A SIGINT within ``_REPEAT_S`` of the first is that echo and is ignored; a
later one is the user pressing again: the handlers are restored and
``KeyboardInterrupt`` stops the rank at once (no checkpoint).

Note [SLURM requeue]
SLURM warns a job before its time limit with the signal ``--signal=USR1@90``
asks for (90 s before). Under SLURM (``SLURM_JOB_ID`` set) SIGUSR1 is handled
by default like SIGTERM: every rank stops after the same step and the
checkpoint is written. Then, once ``fit``'s saves have finished (``close``),
global rank 0 runs ``scontrol requeue $SLURM_JOB_ID`` (as Lightning's
auto-requeue): SLURM ends the job and queues it again with the same id, and
the new run continues with ``resume=auto``. ``requeue=None`` (default) does
this for SIGUSR1 only (the time limit; a SIGTERM is ``scancel`` or the
scheduler's own pre-emption, which requeues by itself when configured);
``True`` for any handled signal; ``False`` never. A fit that failed is not
requeued.

Public through :mod:`fleetlite.callbacks`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from ...distributed import collective
from ...distributed.agreement import side_group
from ...distributed.cluster import requeue_slurm_job, slurm_job_id
from .base import Callback, is_rank_zero
from .model_checkpoint import ModelCheckpoint

__all__ = ["Preemption"]

_MAX_INTERVAL = 10_000  # optimizer steps between two agreements, at most
_REPEAT_S = 1.0  # a second SIGINT sooner than this is the same Ctrl-C arriving twice (Note [second Ctrl-C])


class Preemption(Callback):
    """Stop cleanly on SIGTERM (pre-emption) or Ctrl-C: all ranks stop after the same step and a checkpoint is written.

    Args:
        signals: signal names to handle (default SIGTERM and SIGINT, Ctrl-C: a
            second Ctrl-C stops at once; in a SLURM job also SIGUSR1, what
            ``#SBATCH --signal=USR1@90`` sends before the time limit).
        save_dir: where to write ``step-NNNNNNNN.pt`` (+ ``latest.pt``) when no
            ``ModelCheckpoint(save_last=True)`` is among the callbacks; default
            ``fit(save_dir=...)``. Without either, training stops without a
            checkpoint (a warning says so at the start).
        check_interval_s: how often (in training time) the ranks agree on whether to stop: a stop comes at
            most about twice this after the signal reached every rank, plus two steps. 0: every optimizer step.
        verbose: print one line on rank 0 when training stops for a signal.
        requeue: in a SLURM job, after the checkpoint, rank 0 runs ``scontrol requeue $SLURM_JOB_ID`` so
            the job starts again and continues (``resume=auto``). None: after SIGUSR1 (the time limit) only;
            True: after any handled signal; False: never (Note [SLURM requeue]).

    After ``fit`` returns, ``trainer.preempted`` is the signal's name (else
    None): exit then, and continue later with ``fit(..., resume="latest")``.

    Example::

        ckpt = ModelCheckpoint("runs/a", save_steps=100)
        trainer.fit(data, epochs=90, callbacks=[ckpt, Preemption()], resume="auto", save_dir="runs/a")
        if trainer.preempted:
            raise SystemExit(143)   # 128 + SIGTERM: the job did not finish
    """

    def __init__(self, signals: tuple[str, ...] | list[str] | None = None, save_dir: str | None = None,
                 check_interval_s: float = 0.25, verbose: int = 1, requeue: bool | None = None) -> None:
        super().__init__()
        if isinstance(check_interval_s, bool) or not isinstance(check_interval_s, (int, float)) \
                or not 0 <= check_interval_s <= 60:
            raise ValueError(f"Preemption(check_interval_s={check_interval_s!r}) must be seconds in [0, 60]; 0 "
                             "agrees at every optimizer step")
        self.check_interval_s = float(check_interval_s)
        if signals is None:  # SLURM's time-limit warning too, in a SLURM job (Note [SLURM requeue])
            signals = ("SIGTERM", "SIGINT", "SIGUSR1") if slurm_job_id(os.environ) else ("SIGTERM", "SIGINT")
        if requeue not in (None, True, False):
            raise ValueError(f"Preemption(requeue={requeue!r}) must be None (after SIGUSR1), True or False")
        self.requeue = requeue
        self._failed = False
        names = [signals] if isinstance(signals, str) else list(signals)
        bad = [n for n in names if not isinstance(getattr(signal, str(n), None), signal.Signals)]
        if bad or not names:
            raise ValueError(f"Preemption(signals={signals!r}): unknown signal name(s) {bad}; use names such as "
                             "'SIGTERM' or 'SIGUSR1'")
        self.signals = [getattr(signal, n) for n in names]
        self.save_dir = save_dir
        self.verbose = verbose
        self.received: str | None = None
        self._received_at = 0.0
        self._previous: dict[int, Any] = {}
        self._group = None
        self._work = None
        self._buf = None
        self._boundaries, self._next_poll, self._last_poll = 0, 1, (0.0, 0)
        self._stop_step: int | None = None
        self._own_save = False

    # -- the signal ------------------------------------------------------------------------------------------
    def _handle(self, signum, frame) -> None:
        # only set a flag: the main thread may be inside a collective; the agreement happens at a boundary
        now = time.monotonic()
        if self.received is None:
            self.received = signal.Signals(signum).name
            self._received_at = now
        elif signum == signal.SIGINT and now - self._received_at > _REPEAT_S:  # Note [second Ctrl-C]
            self._uninstall()
            raise KeyboardInterrupt("a second Ctrl-C: stopping at once, without a checkpoint")

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            warnings.warn("fleetlite: Preemption cannot install signal handlers outside the main thread; "
                          "fit runs in another thread, so SIGTERM keeps its default action", stacklevel=3)
            return
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)

    def _uninstall(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    # -- agreement (Note [pre-emption agreement]) -------------------------------------------------------------
    def _poll(self) -> bool:
        """Whether every rank agrees to stop now (the same answer on every rank); starts the next agreement."""
        if self._group is None:
            return self.received is not None
        now = time.perf_counter()
        interval = 1
        if self._work is not None:
            self._work.wait()  # started at the previous poll: finished while the steps ran
            self._work = None
            flag, neg_interval = self._buf.tolist()
            if flag:
                return True
            interval = max(1, -int(neg_interval))
        proposal = 1
        steps = self._boundaries - self._last_poll[1]
        if self.check_interval_s > 0 and steps > 0:
            per_step = (now - self._last_poll[0]) / steps
            proposal = int(min(max(self.check_interval_s / max(per_step, 1e-6), 1), _MAX_INTERVAL))
        self._last_poll = (now, self._boundaries)
        # MAX of [flag, -proposal]: any rank's signal, and the smallest proposed interval
        self._buf = torch.tensor([1 if self.received else 0, -proposal], dtype=torch.int64)
        self._work = tdist.all_reduce(self._buf, op=tdist.ReduceOp.MAX, group=self._group, async_op=True)
        self._next_poll = self._boundaries + interval
        return False

    def _check(self, boundary: bool = True) -> None:
        if boundary:
            self._boundaries += 1
        if self._stop_step is not None or (boundary and self._boundaries < self._next_poll) or not self._poll():
            return
        self._stop()

    def _stop(self, at_end: bool = False) -> None:
        t = self.trainer
        self._stop_step = t.global_step
        t.stop_training = True
        t.preempted = self.received or "a signal on another rank"
        if self.verbose and is_rank_zero():
            when = "training ended meanwhile" if at_end else "every rank stops"
            print(f"fleetlite: {t.preempted} received: {when} after optimizer step {t.global_step}; saving a "
                  "checkpoint", flush=True)
        if self._own_save and self._directory() is not None:
            path = self._directory() / f"step-{t.global_step:08d}.pt"
            t.request_save(lambda: t.save_checkpoint(path, latest=True))

    def _final_agreement(self) -> bool:
        """Whether any rank got a signal during fit (one blocking all-reduce, at the end of training)."""
        if self._group is None:
            return self.received is not None
        if self._work is not None:  # every rank started it: it completes
            self._work.wait()
            self._work = None
        flag = torch.tensor([1 if self.received else 0], dtype=torch.int64)
        tdist.all_reduce(flag, op=tdist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())

    # -- hooks -----------------------------------------------------------------------------------------------
    def _directory(self) -> Path | None:
        d = self.save_dir or getattr(self.trainer, "save_dir", None)
        return None if d is None else Path(d)

    def on_train_begin(self, logs=None):
        self.received, self._stop_step, self._work, self._failed = None, None, None, False
        self._boundaries, self._next_poll, self._last_poll = 0, 1, (time.perf_counter(), 0)
        t = self.trainer
        t.preempted = None
        cbs = t.callbacks.find(ModelCheckpoint) if t.callbacks is not None else []
        self._own_save = not any(cb.save_last for cb in cbs)
        if self._own_save and self._directory() is None and is_rank_zero():
            warnings.warn("fleetlite: Preemption has no checkpoint directory (no ModelCheckpoint, no "
                          "save_dir): on SIGTERM or Ctrl-C training stops without a checkpoint", stacklevel=2)
        if collective.is_initialized() and collective.get_world_size() > 1:
            self._group = side_group("preemption")
        self._install()

    def on_train_batch_end(self, step, logs=None):
        if self.trainer.at_step_boundary:
            self._check()

    def on_epoch_end(self, epoch, logs=None):
        self._check(boundary=False)  # every rank polls here too (evaluation may have taken a while)

    def on_exception(self, error: BaseException) -> None:
        self._failed = True

    def close(self) -> None:
        """Restore the previous signal handlers and, when due, requeue the SLURM job (``fit`` calls it last, after
        its saves finished, also when training fails)."""
        self._uninstall()
        self._work = None
        self._group = None
        if self._stop_step is not None and not self._failed and self._requeue_due() and is_rank_zero():
            _, line = requeue_slurm_job(os.environ)
            print(f"fleetlite: {line}", file=sys.stderr, flush=True)
        self._failed = False

    def _requeue_due(self) -> bool:
        """Note [SLURM requeue]: whether this stop puts the job back in SLURM's queue."""
        if self.requeue is False or slurm_job_id(os.environ) is None:
            return False
        return self.requeue is True or self.received == "SIGUSR1"

    def on_train_end(self, logs=None):
        # a signal that came too late for a poll still counts, on every rank: the caller must not start more
        # collective work (a final evaluation) on some ranks while others exit
        self._uninstall()
        if self._final_agreement() and self._stop_step is None:
            self._stop(at_end=True)
        self._group = None
