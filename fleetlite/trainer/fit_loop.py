"""The epoch loop of ``fit`` as an object that owns its progress: :class:`FitLoop`.

Who owns each ``fit`` argument (as Keras' ``epoch_iterator.py`` says for its own):

* the data adapter (:mod:`~fleetlite.trainer.data_adapter`, built by
  :mod:`~fleetlite.trainer.fit_setup`): ``train_data``/``eval_data`` (also
  Keras' ``x, y``), ``batch_size``, ``shuffle``, ``drop_last``,
  ``num_workers``, ``seed``; Keras' ``validation_split``,
  ``steps_per_epoch`` and ``validation_steps`` wrap it
  (:mod:`~fleetlite.trainer.keras_fit`); ``class_weight`` and
  ``sample_weight`` go with the batches (:mod:`~fleetlite.trainer.weighting`);
* the :class:`FitPlan`, read by this loop: ``epochs``, ``initial_epoch``,
  ``eval_freq``, ``eval_steps``, ``num_iters``, ``accumulate_grad_batches``
  (the gradient-merge window the loop drives);
* the callbacks (:mod:`~fleetlite.trainer.callbacks`): ``callbacks``,
  ``verbose`` and ``log_freq`` (the progress bar), ``save_dir`` (with
  ``ModelCheckpoint``);
* the checkpoint connector (:mod:`~fleetlite.trainer.checkpoint_connector`):
  ``resume``, read before the loop starts and put back by the loop in
  Note [resume order]'s place;
* the Trainer: the model, the optimizer, the loss and the metrics
  (``compile``), and the steps (``train_step``).

The counters live in the Trainer's :class:`FitState` (its :class:`FitProgress`,
Lightning's loop progress, is the checkpoint's ``progress``: its fields, so
saving and loading cannot drift apart), which this loop alone moves forward;
the checkpoint connector saves and loads it, callbacks read it through the
Trainer's read-only properties (``trainer.epoch``, ``trainer.global_step``...).

# Note [epoch end]
``on_epoch_end`` fires, and evaluation runs, only for an epoch that really
ended (its last batch done). A stop in the middle of an epoch
(``stop_training`` set by a callback at a step boundary, or ``num_iters``
reached) ends training without them, so a per-epoch LR scheduler is not
stepped for a half epoch and a resumed run continues that epoch exactly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ..checkpoint import LoadedCheckpoint, capture_rng_state
from ..distributed.faults import peer_failures
from ..distributed.fleet.gradient_merge import GradientMerge
from .callbacks import NonFiniteLossError, Preemption, TerminateOnNaN
from .data_adapter import DataAdapter, batch_length
from .loops import EvaluationLoop, FitPlan, metric_logs, pass_logs

__all__ = ["FitLoop", "FitProgress", "FitState"]


def _zero() -> torch.Tensor:
    return torch.zeros((), dtype=torch.float64)


@dataclass
class FitProgress:
    """The counters a checkpoint's ``progress`` entry holds: ``state_dict`` is exactly these fields.

    Example::

        p = FitProgress(epoch=2, global_step=7)
        FitProgress().load_state_dict(p.state_dict())   # every field back
    """

    epoch: int = 0
    global_step: int = 0  # optimizer steps
    batch_in_epoch: int = 0  # batches of the running epoch done (a resumed epoch counts its earlier ones)
    epoch_finished: bool = False
    pass_done: bool = False  # every batch of the running pass consumed (its epoch only lacks its end)
    accumulate_grad_batches: int = 1  # micro-batches per optimizer step in the running fit

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's ``progress`` entry: the fields of :class:`FitProgress`, by name."""
        return {f.name: getattr(self, f.name) for f in fields(FitProgress)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set every field :meth:`state_dict` wrote (a field it lacks keeps its value)."""
        for f in fields(FitProgress):
            if f.name in state:
                setattr(self, f.name, type(getattr(self, f.name))(state[f.name]))


@dataclass
class FitState(FitProgress):
    """A fit's :class:`FitProgress` plus what the running fit keeps that no checkpoint holds as such: the step
    boundary, the position in the running pass, the epoch's running sums (a checkpoint keeps them per rank,
    :meth:`rank_state_dict`), the training data.

    Example::

        state = FitState()
        state.start_epoch(0, metrics=[])
        state.add_batch(torch.tensor(0.5), 32)
        state.state_dict()   # {'epoch': 0, 'global_step': 0, 'batch_in_epoch': 0, ...}
    """

    at_step_boundary: bool = True  # the running batch ends a gradient-merge window (the optimizer steps)
    pass_index: int = 0  # batches of the running pass done (a resumed epoch's pass starts at 0)
    batch_valid: int = 0  # real (non-padding) samples of the running batch
    fitting: bool = False
    epoch_rng: dict[str, Any] | None = None  # RNG states at the start of the epoch (Note [resume order])
    loss_sum: torch.Tensor = field(default_factory=_zero)  # the epoch's training loss, weighted by batch size
    count: int = 0
    adapter: Any = None  # the training data of the running (or last) fit: its position is checkpointed

    @property
    def accumulate(self) -> int:
        """Micro-batches per optimizer step in the running fit (``accumulate_grad_batches``)."""
        return self.accumulate_grad_batches

    # -- the epoch's running sums --------------------------------------------------------------------------------
    def reset_sums(self, metrics) -> None:
        self.loss_sum, self.count = _zero(), 0
        for m in metrics:
            m.reset()

    def add_batch(self, loss: torch.Tensor, n: int) -> torch.Tensor:
        """Add a batch's mean loss (weight ``n``) to the sums; returns the running mean (a device tensor)."""
        # the sums stay on the loss's device: no device sync per step (read at log time / epoch end); the epoch's
        # first batch moves the CPU zero there without blocking (a pageable copy is staged at once)
        self.loss_sum = self.loss_sum.to(loss.device, non_blocking=True) + loss.detach().to(torch.float64) * n
        self.count += n
        return self.loss_sum / max(self.count, 1)

    def sums(self) -> torch.Tensor:
        """``[loss_sum, count]`` on the CPU (a device sync), to reduce across ranks."""
        return torch.tensor([float(self.loss_sum), float(self.count)], dtype=torch.float64)

    # -- epochs ------------------------------------------------------------------------------------------------
    def start_epoch(self, epoch: int, metrics) -> None:
        """Enter ``epoch`` afresh: counters and sums at zero, the epoch-start RNG states captured."""
        self.epoch, self.epoch_finished, self.batch_in_epoch, self.pass_done = epoch, False, 0, False
        self.reset_sums(metrics)
        self.epoch_rng = capture_rng_state()

    def resume_epoch(self, epoch: int, metrics, sums: dict[str, Any], epoch_rng: dict[str, Any] | None) -> None:
        """Re-enter an epoch saved midway: its partial sums and epoch-start RNG states (Note [resume order])."""
        self.epoch, self.epoch_finished, self.pass_done = epoch, False, False
        self.reset_sums(metrics)
        self.loss_sum, self.count = torch.tensor(sums["loss_sum"], dtype=torch.float64), int(sums["count"])
        for m, s in zip(metrics, sums.get("metrics") or []):
            m.load_state_dict(s)
        self.epoch_rng = epoch_rng

    def data_position(self) -> dict[str, Any] | None:
        """The training data's position (a sampler cursor), or None when the data cannot say it."""
        a = self.adapter
        return a.position(self.pass_index) if a is not None and a.resumable else None

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def rank_state_dict(self, metrics) -> dict[str, Any]:
        """This rank's entry of the checkpoint's ``ranks``: RNG states now and at the epoch start, partial sums."""
        return {"rng": capture_rng_state(), "epoch_rng": self.epoch_rng,
                "train_accum": {"loss_sum": float(self.loss_sum), "count": int(self.count),
                                "metrics": [m.state_dict() for m in metrics]}}


class FitLoop:
    """One ``fit`` call's epoch loop over ``train`` (and ``evaluation``), driven by ``plan``.

    Example::

        FitLoop(trainer, train, evaluation, plan, callbacks).run(resume=None)
    """

    def __init__(self, trainer, train: DataAdapter, evaluation: DataAdapter | None, plan: FitPlan,
                 callbacks) -> None:
        self.trainer, self.train, self.evaluation, self.plan, self.callbacks = (trainer, train, evaluation, plan,
                                                                                 callbacks)
        self.progress = trainer.fit_state  # this loop moves it forward; the checkpoint connector saves it

    def run(self, resume: LoadedCheckpoint | None) -> None:
        """The epoch loop; a lost peer rank becomes a ``CollectiveError`` naming it (Note [lost rank diagnosis]).

        The optimizer's gradient-merge window is driven by the loop (Note [gradient merge window]); the
        asynchronous save in flight is settled however the loop ends (Note [saves in flight]).
        """
        t, st, callbacks = self.trainer, self.progress, self.callbacks
        st.adapter, st.fitting = self.train, True
        saves = t.checkpoint_connector
        try:
            with peer_failures("training"), t.optimizer.merge.driven(self.plan.accumulate, t.merge_avg) as merge:
                st.accumulate_grad_batches = merge.k
                try:
                    self._epochs(resume, merge)
                except NonFiniteLossError:  # raised on every rank at the same step: they commit together
                    saves.finish_saves()  # Note [saves in flight]
                    raise
                saves.finish_saves()
        except BaseException as e:
            callbacks.on_exception(e)
            saves.abandon_saves(e)
            raise
        finally:
            st.fitting, st.pass_done = False, False
            saves.drop_requests()
            for cb in callbacks.find(Preemption):  # signal handlers back even when training failed
                cb.close()

    def _stop_due(self) -> bool:
        num_iters = self.plan.num_iters
        return self.trainer.stop_training or (num_iters is not None and self.progress.global_step >= num_iters)

    def _epochs(self, resume: LoadedCheckpoint | None, merge: GradientMerge) -> None:
        t, st, callbacks, train = self.trainer, self.progress, self.callbacks, self.train
        t.stop_training = False
        start_epoch, resumed, exhausted = self.plan.initial_epoch, None, False  # a resumed position wins
        if resume is None:
            callbacks.on_train_begin()
        else:  # everything put back in one method, on_train_begin at its place (Note [resume order])
            start_epoch, resumed, exhausted = t.checkpoint_connector.restore(resume, train, callbacks)
        logs: dict[str, Any] = {}
        for epoch in range(start_epoch, self.plan.epochs):
            if self._stop_due():
                break
            if resumed is None:
                train.set_epoch(epoch)
                st.start_epoch(epoch, t.metrics)
                batches = iter(train)
            else:
                batches = resumed
            pass_len = 0 if resumed is not None and exhausted else train.length()
            resumed = None
            callbacks.params["steps"] = None if pass_len is None else st.batch_in_epoch + pass_len
            callbacks.on_epoch_begin(epoch)
            t.parallel_network.train()
            st.pass_index = 0
            st.pass_done = pass_len == 0
            if not self._batches(batches, pass_len, merge):  # Note [epoch end]
                break
            logs = self._epoch_logs()
            if self.evaluation is not None and t.eval_due(epoch, self.plan.eval_freq):
                val = EvaluationLoop(t).run(self.evaluation, callbacks)
                logs.update({f"val_{k}": v for k, v in val.items()})
            st.epoch_finished = True
            callbacks.on_epoch_end(epoch, logs)
            self._run_saves()
        st.at_step_boundary = True
        if train.sharded:
            t.steps.agree_buffers()  # Note [agreed buffers]
        callbacks.on_train_end(logs)
        self._run_saves()

    def _run_saves(self) -> None:
        """Run the saves the hooks requested; a non-finite loss not yet looked at is looked at first, so nothing is
        saved after it (Note [non-finite loss])."""
        t = self.trainer
        if t.checkpoint_connector.has_requests():
            for cb in self.callbacks.find(TerminateOnNaN):
                cb.before_save()
        t.run_pending_saves()

    def _batches(self, batches, pass_len: int | None, merge: GradientMerge) -> bool:
        """Train on the pass's batches; whether the pass ended (False: stopped midway, Note [epoch end])."""
        t, st, callbacks, train = self.trainer, self.progress, self.callbacks, self.train
        ended = True
        for batch in batches:
            n = batch_length(batch)
            valid = train.num_valid(st.pass_index, batch)
            st.at_step_boundary = merge.begin(last=pass_len is not None and st.pass_index == pass_len - 1,
                                              open_ended=pass_len is None)
            st.batch_valid = n if valid is None else valid
            callbacks.on_train_batch_begin(st.batch_in_epoch)
            out = t.train_step(t.to_device(batch))
            merge.end()
            step_logs = self._record(out, n)
            st.batch_in_epoch += 1
            st.pass_index += 1
            st.pass_done = pass_len is not None and st.pass_index >= pass_len
            if st.at_step_boundary:
                st.global_step += 1
            callbacks.on_train_batch_end(st.batch_in_epoch - 1, step_logs)
            self._run_saves()
            if self.evaluation is not None and st.at_step_boundary and self.plan.eval_steps \
                    and st.global_step % self.plan.eval_steps == 0:
                self._evaluate_in_epoch()
            if st.at_step_boundary and self._stop_due():
                ended = pass_len is not None and st.pass_index == pass_len
                break
        if merge.micro:  # a loader without len() ended inside a window: sync and apply it
            merge.flush(p for p in t.network.parameters() if p.requires_grad)
            st.at_step_boundary = True
            t.optimizer_step()
            st.global_step += 1
        st.at_step_boundary = True
        return ended

    def _record(self, out: dict[str, Any], n: int) -> dict[str, Any]:
        """Add a training batch to the epoch's running sums; the batch hook's logs (Keras: running values).

        The training loss is the optimized one: batch means weighted by batch size, padding repeats included;
        metrics count real samples only (``update_metrics`` trims the padding).
        """
        if not isinstance(out, dict) or "loss" not in out:
            raise TypeError(f"train_step must return a dict with 'loss', got {type(out).__name__}")
        logs = {"loss": self.progress.add_batch(out["loss"], n)}
        if self.trainer.steps.has_outputs:  # a pipeline's metrics live on its last stage (Note [step runners])
            logs.update(metric_logs(self.trainer.metrics, lazy=True))
        logs.update({k: v for k, v in out.items() if k != "loss"})
        logs["batch_size"] = n
        return logs

    def _epoch_logs(self) -> dict[str, Any]:
        """The epoch's loss and metrics, reduced over the data group (Note [data group]; a pipeline's last stage
        computes them and sends them to the other stages)."""
        return pass_logs(self.trainer, self.progress.sums(), self.train.sharded, True)

    def _evaluate_in_epoch(self) -> None:
        """An evaluation in the middle of an epoch (Keras-side ``eval_steps``), on copies of the metrics, so the
        epoch's training metrics are not disturbed; recorded in ``trainer.step_evaluations``."""
        t = self.trainer
        metrics = [copy.deepcopy(m) for m in t.metrics]
        logs = EvaluationLoop(t, metrics).run(self.evaluation, self.callbacks)
        t.step_evaluations.append({"step": t.global_step, **{f"val_{k}": v for k, v in logs.items()}})
