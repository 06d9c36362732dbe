"""What ``Trainer.fit`` resolves before its loop runs, each thing once: the arguments checked, the data
adapters, the callbacks, the loop plan (:class:`~fleetlite.trainer.loops.FitPlan`) and, for a resume, the
checkpoint read and checked (:meth:`~fleetlite.trainer.checkpoint_connector.CheckpointConnector.read`; the loop
restores it). Also the checks of
``compile``'s training objects (metrics, clipping).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from ..checkpoint import LoadedCheckpoint, warn_if_overwriting
from .arguments import check_positive
from .callbacks import CallbackList, ModelCheckpoint
from .clipping import check_hybrid_clipping, resolve_grad_clip
from .data_adapter import DataAdapter, build_adapter, describe_sizes, keras_xy
from .keras_fit import apply_keras_options, check_call_order
from .loops import FitPlan
from .metrics import Metric
from .torchmetrics_adapter import TorchMetric, is_torchmetric
from .weighting import SampleWeights, configure_weights

__all__ = ["FitSetup", "as_metrics", "resolve_clipping"]


def as_metrics(metrics: Any) -> list[Metric]:
    """``metrics`` (one, a list, torchmetrics ones) as a checked list of fleetlite metrics with unique names."""
    metrics = [] if metrics is None else ([metrics] if isinstance(metrics, Metric) or is_torchmetric(metrics)
                                           else list(metrics))
    metrics = [TorchMetric(m) if is_torchmetric(m) else m for m in metrics]
    for m in metrics:
        if not isinstance(m, Metric):
            raise TypeError(f"metrics must be fleetlite.metric.Metric instances, got {type(m).__name__}; "
                            "subclass Metric (see fleetlite.metric.Accuracy)")
    names = [n for m in metrics for n in m.names()]
    if len(set(names)) != len(names):
        raise ValueError(f"metric names must be unique, got {names}; pass name=... to tell them apart")
    return metrics


def resolve_clipping(current: list[Any], optimizer: Any, grad_clip: Any, clipnorm: float | None,
                     clipvalue: float | None, global_clipnorm: float | None) -> list[Any]:
    """``compile``'s clippers: the given ones (also Paddle's ``optimizer._grad_clip``), else ``current`` kept."""
    given = grad_clip if grad_clip is not None else getattr(optimizer, "_grad_clip", None)
    if given is not None or any(v is not None for v in (clipnorm, clipvalue, global_clipnorm)):
        return resolve_grad_clip(given, clipnorm, clipvalue, global_clipnorm)
    return current


def _accumulate(k: int, accumulate_grad_batches: int) -> int | None:
    """The fit's gradient-merge k: ``accumulate_grad_batches``, else None (the strategy's ``k_steps``, ``k``)."""
    if accumulate_grad_batches == 1:
        return None
    if k > 1 and k != accumulate_grad_batches:
        raise ValueError(f"accumulate_grad_batches={accumulate_grad_batches} conflicts with the strategy's "
                         f"gradient_merge k_steps={k}; set only one of them")
    return accumulate_grad_batches


def _checkpoint_dir(save_dir: Path | None, cbs) -> Path | None:
    if save_dir is not None:
        return save_dir
    dirs = [cb.save_dir for cb in cbs.find(ModelCheckpoint) if cb.save_dir]
    return Path(dirs[0]) if dirs else None


class FitSetup(NamedTuple):
    """What ``fit`` resolved before its loop: the data adapters, the callbacks, the plan, the checkpoint to
    resume from (read, not yet restored) and the sample weighting of the batches."""

    train: DataAdapter
    evaluation: DataAdapter | None
    callbacks: Any
    plan: FitPlan
    resume: LoadedCheckpoint | None
    weighting: SampleWeights

    @classmethod
    def prepare(cls, t, train_data: Any, eval_data: Any, epochs: int, batch_size: int, eval_freq: int, log_freq: int,
                callbacks: Any, shuffle: bool, drop_last: bool, num_workers: int, accumulate_grad_batches: int,
                num_iters: int | None, resume: Any, verbose: int, seed: int, *,
                validation_split: float, steps_per_epoch: int | None, validation_steps: int | None,
                initial_epoch: int, eval_steps: int | None, class_weight: Any, sample_weight: Any) -> FitSetup:
        """What a fit resolves before its loop (:class:`FitSetup`); changes nothing on the Trainer ``t`` but its
        wrapping (``t.setup``). ``t.save_dir`` is the fit's ``save_dir`` already (callbacks read it).

        Raises before any training when an argument, the data or the resume checkpoint does not fit.
        """
        xy = keras_xy(train_data, eval_data, "fit")
        if xy is not None:  # Keras' fit(x, y): the labels came in the eval_data slot
            train_data, eval_data = xy, None
        check_call_order(train_data, eval_data, batch_size, epochs, "keras")
        train_data, weighting = configure_weights(t.loss_fn, train_data, class_weight, sample_weight)
        t.step_evaluations = []  # fit(eval_steps=...)'s, of this fit
        train_data, eval_data = apply_keras_options(t.device, train_data, eval_data, batch_size, shuffle, drop_last,
                                                    num_workers, seed, validation_split, steps_per_epoch,
                                                    validation_steps, initial_epoch, eval_steps)
        check_positive(epochs=epochs, batch_size=batch_size, eval_freq=eval_freq, log_freq=log_freq,
                       accumulate_grad_batches=accumulate_grad_batches, num_iters=num_iters)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers={num_workers!r} must be an integer >= 0")
        t.setup(training=True)
        check_hybrid_clipping(t.optimizer, t.grad_clip)
        plan = FitPlan(epochs, eval_freq, num_iters, initial_epoch, eval_steps,
                       _accumulate(t.optimizer.merge.k, accumulate_grad_batches))
        pin = t.device.type == "cuda"
        train = build_adapter(train_data, batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers,
                              seed=seed, pin_memory=pin, role="train")
        if train.length() == 0:
            raise ValueError(f"the training data yields no batch ({describe_sizes(train)}), so fit would train "
                             "nothing: use a smaller batch_size, drop_last=False, or more data")
        evaluation = None if eval_data is None else build_adapter(eval_data, batch_size, num_workers=num_workers,
                                                                      pin_memory=pin, role="eval")
        if evaluation is not None and evaluation.exact_reason() is not None:  # fail now, not after an epoch
            raise ValueError(f"eval_data cannot be evaluated exactly: {evaluation.exact_reason()}")
        # what the step runner cannot train, before the first step (Note [step runners]; a pipeline's: Note
        # [hybrid trainer])
        t.steps.check_fit(train, plan.accumulate or t.optimizer.merge.k,
                          weighting.field or weighting.class_table is not None)
        if evaluation is not None:
            t.steps.check_inference(evaluation, "evaluation")
        if getattr(t, "ema", None) is not None and not any(c is t.ema for c in callbacks or []):
            callbacks = [*(callbacks or []), t.ema]  # compile(ema_decay=...)
        cbs = CallbackList.for_call(callbacks, t, verbose=verbose, log_freq=log_freq, epochs=epochs, train=train,
                                    batch_size=batch_size)
        cbs.params["eval_freq"] = eval_freq if evaluation is not None else None
        ckpt_dir = _checkpoint_dir(t.save_dir, cbs)
        if resume is None and any(getattr(cb, "_auto_resume", False) for cb in cbs):
            resume = "auto"  # BackupAndRestore
        if resume is None:
            warn_if_overwriting(ckpt_dir)
        loaded: LoadedCheckpoint | None = t.checkpoint_connector.read(resume, ckpt_dir, train)
        return cls(train, evaluation, cbs, plan, loaded, weighting)
