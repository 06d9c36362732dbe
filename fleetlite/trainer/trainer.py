"""``fleetlite.Trainer``: Keras-style fit/evaluate/predict over the fleet facade (Paddle's ``paddle.Model``).

The loops are in :mod:`~fleetlite.trainer.loops`, data adaptation in
:mod:`~fleetlite.trainer.data_adapter`, environment and wrapping in
:mod:`~fleetlite.trainer.connector`, the checkpointed state in
:mod:`~fleetlite.trainer.state`. This class holds the model, the steps
(override ``train_step``/``eval_step``/``predict_step`` as in Keras) and the
public API.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .callbacks import Callback, CallbackList, History
from .connector import Connector, check_positive, plain_config
from .data_adapter import DataAdapter, build_adapter, describe_sizes, keras_evaluate_args, keras_xy
from .metrics import Metric

__all__ = ["Trainer"]


class Trainer:
    """Train, evaluate and predict with one object; distributed when launched on several ranks.

    Args:
        model: the ``nn.Module`` (or a ``fleetlite.DataParallel`` already wrapping it).
        optimizer: a torch optimizer over the model's parameters (needed by ``fit``).
        loss: ``loss(outputs, labels)`` returning the batch mean (e.g. ``nn.CrossEntropyLoss()``).
        metrics: a :class:`~fleetlite.metric.Metric` or a list of them.
        strategy: a ``fleet.DistributedStrategy`` (or dict): amp, gradient merge, sharding, ...
        device: ``"auto"`` (this rank's GPU, else CPU), ``"cpu"``, ``"cuda:0"``...
        config: the run's configuration (plain values), stored in checkpoints.
        compile: ``True`` or a dict of ``torch.compile`` arguments: compile the network (in place, before
            the data-parallel wrapping; ``state_dict`` keys unchanged). A ``torch.compile``-d module is
            unwrapped and compiled the same way.

    Under ``fleetlite launch``/torchrun with several ranks the Trainer calls
    ``fleet.init``, wraps the model with ``fleet.distributed_model`` and the
    optimizer with ``fleet.distributed_optimizer``; one process runs the same path.

    Example::

        import torch, fleetlite
        from fleetlite.vision.datasets import SyntheticCifar10
        from torchvision.transforms import ToTensor

        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
        trainer = fleetlite.Trainer(net, torch.optim.Adam(net.parameters(), 1e-3), torch.nn.CrossEntropyLoss(),
                                    metrics=fleetlite.metric.Accuracy())
        data = SyntheticCifar10(mode="train", transform=ToTensor(), size=512)
        history = trainer.fit(data, epochs=2, batch_size=64)
        print(history.history["loss"], trainer.evaluate(data))
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 loss: Callable[..., torch.Tensor] | None = None, metrics: Metric | Sequence[Metric] | None = None,
                 strategy: Any = None, device: str | torch.device = "auto", config: Any = None,
                 compile: bool | dict[str, Any] = False) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Trainer needs a torch.nn.Module as model, got {type(model).__name__}")
        from ..parallel import DataParallel
        from .connector import unwrap_compiled

        model, was_compiled = unwrap_compiled(model)  # no _orig_mod. keys (Note [compile in place])
        compile = compile or was_compiled

        self.network: nn.Module = model.module if isinstance(model, DataParallel) else model
        self._given_model = model
        self.parallel_network: nn.Module | None = None
        self._connector = Connector(strategy, device, compile)
        self.config = plain_config(config)
        self._set_training_objects(optimizer, loss, metrics)
        self.grad_clip: list[Any] = []
        # progress, read by callbacks
        self.epoch = 0
        self.global_step = 0
        self.batch_in_epoch = 0
        self.epoch_finished = False
        self.at_step_boundary = True
        self.stop_training = False
        self.preempted: str | None = None  # the signal that stopped fit (see fleetlite.callbacks.Preemption)
        self.terminated_on_nan: int | None = None  # the step where TerminateOnNaN stopped fit
        self.fitting = False
        self.save_dir: Path | None = None
        self._accumulate = 1
        self._accumulate_avg = True
        self._callbacks: CallbackList | None = None
        self._pending: list[Callable[[], None]] = []
        self._train_adapter: DataAdapter | None = None
        self._pass_index = 0
        self._batch_valid = 0
        self._epoch_rng: dict[str, Any] | None = None
        self._export_example: tuple[torch.Tensor, ...] | None = None  # two input rows, for export()
        self._reset_train_accum()

    def _set_training_objects(self, optimizer, loss, metrics) -> None:
        if loss is not None and not callable(loss):
            raise TypeError(f"loss must be callable as loss(outputs, labels), got {type(loss).__name__}")
        from .torchmetrics_adapter import TorchMetric, is_torchmetric

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
        self.user_optimizer = optimizer
        self.optimizer = None
        self.loss_fn = loss
        self.metrics: list[Metric] = metrics

    def compile(self, optimizer: torch.optim.Optimizer | None = None, loss: Callable[..., torch.Tensor] | None = None,
                metrics: Metric | Sequence[Metric] | None = None, strategy: Any = None, *, grad_clip: Any = None,
                clipnorm: float | None = None, clipvalue: float | None = None,
                global_clipnorm: float | None = None, ema_decay: float | None = None) -> Trainer:
        """Keras' ``compile`` (Paddle's ``prepare``): set the optimizer, loss, metrics and strategy.

        Gradient clipping (see :mod:`fleetlite.trainer.clipping`): Keras' ``clipnorm`` (each tensor),
        ``global_clipnorm``, ``clipvalue``, or Paddle's ``grad_clip=ClipGradByGlobalNorm(...)`` (also read from
        ``optimizer._grad_clip``); applied once per step after the all-reduce, the accumulation and amp unscaling.
        ``ema_decay``: keep an EMA of the weights in ``trainer.ema`` (a :class:`~fleetlite.callbacks.EMA` that
        ``fit`` adds to its callbacks).
        """
        if ema_decay is not None:
            from .callbacks import EMA

            self.ema = EMA(ema_decay)
        from .clipping import resolve_grad_clip

        given_clip = grad_clip if grad_clip is not None else getattr(optimizer, "_grad_clip", None)
        if given_clip is not None or any(v is not None for v in (clipnorm, clipvalue, global_clipnorm)):
            self.grad_clip = resolve_grad_clip(given_clip, clipnorm, clipvalue, global_clipnorm)
        # (no clipping argument: the clipping set before is kept, as the other arguments not passed)
        if strategy is not None:
            if self._connector._started:
                raise RuntimeError("the strategy cannot change after the Trainer has started (fleet is "
                                   "initialised); pass it to the Trainer or to the first compile call")
            self._connector.user_strategy = strategy
        wrapped = self.optimizer if optimizer is None else None
        # arguments not passed keep their values (Trainer(net, loss=...).compile(opt) keeps the loss)
        self._set_training_objects(self.user_optimizer if optimizer is None else optimizer,
                                   self.loss_fn if loss is None else loss,
                                   self.metrics if metrics is None else metrics)
        self.optimizer = wrapped
        return self

    prepare = compile  # Paddle's name

    # -- environment ----------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._connector.device

    @property
    def strategy(self):
        return self._connector.strategy

    @property
    def run_dir(self) -> Path:
        """Where run files go: ``fit(save_dir=...)``, else the current directory."""
        return Path(self.save_dir) if self.save_dir is not None else Path.cwd()

    def _prepare(self, training: bool) -> None:
        if self.parallel_network is None:
            self._connector.start()
            self._connector.check_same_config(self.config)  # fail fast, before the model is wrapped
            from ..distributed.fleet.amp import warn_cpu_amp

            warn_cpu_amp(self.strategy, self.device)
            self.parallel_network, self.network = self._connector.setup_model(self._given_model)
            self._accumulate = self._connector.accumulate
            self._accumulate_avg = self._connector.accumulate_avg
        if training:
            if self.user_optimizer is None:
                raise ValueError("fit needs an optimizer: pass Trainer(model, optimizer, loss) or call "
                                 "compile(optimizer, loss) first")
            if self.loss_fn is None and type(self).train_step is Trainer.train_step:
                raise ValueError("fit needs a loss: pass Trainer(..., loss=nn.CrossEntropyLoss()) or compile(..., "
                                 "loss=...), or override train_step")
        if self.optimizer is None and self.user_optimizer is not None:
            self.optimizer = self._connector.setup_optimizer(self.user_optimizer, self.parallel_network)

    # -- steps (override these) -----------------------------------------------------------------------------
    def split_batch(self, batch: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """(inputs, labels) of a batch: ``(x, y)`` → ``((x,), (y,))``; ``(x1, x2, y)`` → ``((x1, x2), (y,))``."""
        if isinstance(batch, (list, tuple)):
            if len(batch) == 1:
                return (batch[0],), ()
            inputs = batch[0] if len(batch) == 2 else batch[:-1]
            inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
            return inputs, (batch[-1],)
        return (batch,), ()

    def compute_loss(self, outputs: Any, labels: Sequence[Any]) -> torch.Tensor:
        """``loss(outputs, *labels)`` (``loss(*outputs, *labels)`` when the model returns a tuple)."""
        if self.loss_fn is None:
            raise ValueError("no loss function: pass loss=... to the Trainer or compile()")
        outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        if labels:
            return self.loss_fn(*outs, *labels)
        try:  # inputs only: fine for a loss of the outputs alone, else say what is missing
            return self.loss_fn(*outs)
        except TypeError as e:
            raise ValueError(f"the batch has no labels (inputs only), but the loss needs them ({e}): pass inputs "
                             "and labels, e.g. fit((x, y)) or fit(x, y), or a Dataset yielding (input, label); "
                             "or override compute_loss / train_step") from None

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss``, divided for gradient accumulation and scaled for float16 amp."""
        if self._accumulate > 1 and self._accumulate_avg:
            loss = loss / self._accumulate
        if self.optimizer is not None and hasattr(self.optimizer, "backward"):
            self.optimizer.backward(loss)
        else:
            loss.backward()

    def optimizer_step(self) -> None:
        """Step the optimizer and clear the gradients; only at a step boundary (accumulation)."""
        if self.at_step_boundary:
            if self.grad_clip:
                from .clipping import clip_gradients

                clip_gradients(self)  # Note [clip order]
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def update_metrics(self, outputs: Any, labels: Sequence[Any]) -> None:
        """Feed the real (non-padding) samples of the batch to every metric (Paddle's compute → update)."""
        if not self.metrics:
            return
        from ..io.evaluation import trim_batch

        outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        n = self._batch_valid
        outs = [o.detach() for o in trim_batch(outs, n)]
        labels = trim_batch(list(labels), n)
        for m in self.metrics:
            res = m.compute(*outs, *labels)
            update = getattr(m, "_update_lazy", m.update)  # fleetlite's metrics: no device sync per batch
            update(*(res if isinstance(res, (list, tuple)) else (res,)))

    def train_step(self, batch: Any) -> dict[str, Any]:
        """One training batch: forward, loss, backward, optimizer step (at boundaries), metrics.

        Returns a dict with at least ``"loss"`` (a tensor). Keras' custom-step
        pattern: override and use ``self.parallel_network``, ``self.backward``,
        ``self.optimizer_step``, ``self.update_metrics``.
        """
        from .weighting import batch_weights, split_weights, weighted_loss

        batch, sample = split_weights(self, batch)  # Keras' sample_weight / class_weight
        inputs, labels = self.split_batch(batch)
        outputs = self.parallel_network(*inputs)
        weights = batch_weights(self, labels, sample)
        loss = self.compute_loss(outputs, labels) if weights is None else weighted_loss(self, outputs, labels, weights)
        self.backward(loss)
        self.optimizer_step()
        self.update_metrics(outputs, labels)
        return {"loss": loss}

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """One evaluation batch (padding already removed, under ``no_grad``): loss and metrics."""
        inputs, labels = self.split_batch(batch)
        outputs = self.network(*inputs)
        self.update_metrics(outputs, labels)
        if self.loss_fn is None or not labels:
            return {}
        return {"loss": self.compute_loss(outputs, labels)}

    def predict_step(self, batch: Any) -> Any:
        """One prediction batch: the model's outputs for the batch's inputs (labels, if present, ignored)."""
        inputs, _ = self.split_batch(batch)
        return self.network(*inputs)

    # -- public loops -----------------------------------------------------------------------------------------
    def fit(self, train_data: Any, eval_data: Any = None, epochs: int = 1, batch_size: int = 32, eval_freq: int = 1,
            log_freq: int = 10, callbacks: Sequence[Callback] | None = None, shuffle: bool = True,
            drop_last: bool = False, num_workers: int = 0, accumulate_grad_batches: int = 1,
            num_iters: int | None = None, resume: Any = None, save_dir: str | os.PathLike | None = None,
            verbose: int = 1, seed: int = 0, *, validation_split: float = 0.0, steps_per_epoch: int | None = None,
            validation_steps: int | None = None, initial_epoch: int = 0, eval_steps: int | None = None,
            class_weight: dict[int, float] | None = None, sample_weight: Any = None) -> History:
        """Train for ``epochs`` epochs; returns the :class:`~fleetlite.callbacks.History`.

        Keras' ``validation_split``, ``steps_per_epoch``, ``validation_steps``, ``initial_epoch``, ``eval_steps``: see
        :mod:`fleetlite.trainer.keras_fit`; ``class_weight``, ``sample_weight``: :mod:`fleetlite.trainer.weighting`.

        ``resume``: ``"latest"`` (newest valid checkpoint in ``save_dir``,
        falling back with a warning), ``"auto"`` (same, or a fresh start), a
        checkpoint file, or a directory; ``None`` starts fresh and warns when
        ``save_dir`` already holds an earlier run's checkpoints (they get
        overwritten), ``False`` starts fresh without a word. Everything is
        restored, mid-epoch included (see :mod:`fleetlite.trainer.state`). ``num_iters`` caps the
        total optimizer steps; ``seed`` seeds the shuffle of a Dataset.
        """
        from . import loops, state
        from .keras_fit import check_call_order

        xy = keras_xy(train_data, eval_data, "fit")
        if xy is not None:  # Keras' fit(x, y): the labels came in the eval_data slot
            train_data, eval_data = xy, None
        if not getattr(self, "_paddle_hapi", False):
            check_call_order(train_data, eval_data, batch_size, epochs, "keras")
        self.terminated_on_nan = None
        from .keras_fit import apply_keras_options
        from .weighting import configure_weights

        train_data = configure_weights(self, train_data, class_weight, sample_weight)
        train_data, eval_data = apply_keras_options(self, train_data, eval_data, batch_size, shuffle, drop_last,
                                                    num_workers, seed, validation_split, steps_per_epoch,
                                                    validation_steps, initial_epoch, eval_steps)
        check_positive(epochs=epochs, batch_size=batch_size, eval_freq=eval_freq, log_freq=log_freq,
                        accumulate_grad_batches=accumulate_grad_batches, num_iters=num_iters)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers={num_workers!r} must be an integer >= 0")
        self._prepare(training=True)
        if accumulate_grad_batches > 1:
            if self._connector.accumulate > 1 and self._connector.accumulate != accumulate_grad_batches:
                raise ValueError(f"accumulate_grad_batches={accumulate_grad_batches} conflicts with the strategy's "
                                 f"gradient_merge k_steps={self._connector.accumulate}; set only one of them")
            self._accumulate = accumulate_grad_batches
        self.save_dir = Path(save_dir) if save_dir is not None else None
        pin = self.device.type == "cuda"
        train = build_adapter(train_data, batch_size, shuffle, drop_last, num_workers, seed, pin, "train")
        if train.length() == 0:
            raise ValueError(f"the training data yields no batch ({describe_sizes(train)}), so fit would train "
                             "nothing: use a smaller batch_size, drop_last=False, or more data")
        evaluation = None if eval_data is None else build_adapter(eval_data, batch_size, False, False,
                                                                  num_workers, 0, pin, "eval")
        if evaluation is not None and evaluation.exact_reason() is not None:  # fail now, not after an epoch
            raise ValueError(f"eval_data cannot be evaluated exactly: {evaluation.exact_reason()}")
        if getattr(self, "ema", None) is not None and not any(c is self.ema for c in callbacks or []):
            callbacks = [*(callbacks or []), self.ema]  # compile(ema_decay=...)
        cbs = self._make_callbacks(callbacks, verbose, log_freq, epochs, train, batch_size)
        cbs.params["eval_freq"] = eval_freq if evaluation is not None else None
        ckpt_dir = self.save_dir
        if ckpt_dir is None:
            from .callbacks import ModelCheckpoint

            dirs = [cb.save_dir for cb in cbs.find(ModelCheckpoint) if cb.save_dir]
            ckpt_dir = Path(dirs[0]) if dirs else None
        if resume is None and any(getattr(cb, "_auto_resume", False) for cb in cbs):
            resume = "auto"  # BackupAndRestore
        if resume is None:
            state.warn_if_overwriting(ckpt_dir)
        path = state.resolve_resume(resume, ckpt_dir)
        resume_state = self._restore(path, train) if path is not None else None
        self._train_adapter, self._callbacks, self.fitting = train, cbs, True
        try:
            loops.run_fit(self, train, evaluation, epochs, eval_freq, num_iters, cbs, resume_state)
        except BaseException as e:
            for cb in cbs:  # trackers mark their run FAILED (fleetlite.trainer.callbacks.tracker)
                if hasattr(cb, "on_exception"):
                    cb.on_exception(e)
            raise
        finally:
            self.fitting = False
            self._pending.clear()
            from .callbacks import Preemption

            for cb in cbs.find(Preemption):  # signal handlers back even when training failed
                cb.close()
        return cbs.find(History)[0]

    def evaluate(self, eval_data: Any, batch_size: int = 32, log_freq: int = 10,
                 callbacks: Sequence[Callback] | None = None, num_workers: int = 0, verbose: int = 1) -> dict[str, Any]:
        """Loss and metrics over ``eval_data``, exact across ranks (each sample counted once)."""
        from . import loops

        eval_data, batch_size = keras_evaluate_args(eval_data, batch_size)  # Keras' evaluate(x, y)
        check_positive(batch_size=batch_size, log_freq=log_freq)
        self._prepare(training=False)
        pin = self.device.type == "cuda"  # pinned host batches: the non-blocking copy overlaps compute
        data = build_adapter(eval_data, batch_size, False, False, num_workers, 0, pin, "eval")
        cbs = self._make_callbacks(callbacks, verbose, log_freq, 1, None, batch_size, history=False)
        return loops.run_evaluate(self, data, cbs)

    def predict(self, data: Any, batch_size: int = 32, stack_outputs: bool = False, num_workers: int = 0,
                callbacks: Sequence[Callback] | None = None, verbose: int = 0,
                output_dir: str | os.PathLike | None = None) -> Any:
        """Model outputs for ``data`` in dataset order, gathered across ranks without duplicates.

        Returns, for a model with one output, a list of batch tensors (one
        tensor with ``stack_outputs=True``); for several outputs, a list with
        one such entry per output (Paddle's layout). Outputs whose non-batch dims
        differ between batches come back batch by batch (Note [predict batches]).
        ``output_dir``: stream the outputs to disk instead (memory independent of
        the data size) and return the merged ``.npy`` paths (Note [streamed predictions]).
        """
        from . import loops

        check_positive(batch_size=batch_size)
        self._prepare(training=False)
        pin = self.device.type == "cuda"
        adapter = build_adapter(data, batch_size, False, False, num_workers, 0, pin, "predict")
        cbs = self._make_callbacks(callbacks, verbose, 10, 1, None, batch_size, history=False)
        writer = None
        if output_dir is not None:
            from .predict_writer import PredictionWriter

            writer = PredictionWriter(output_dir, self._connector.rank, self._connector.world_size)
        return loops.run_predict(self, adapter, batch_size, stack_outputs, cbs, writer)

    def _eval_due(self, epoch: int, eval_freq: int) -> bool:
        """Evaluate after ``epoch`` (0-based)? Keras: every ``eval_freq``-th epoch; ``fleetlite.Model``: Paddle's."""
        return (epoch + 1) % eval_freq == 0

    # -- callbacks and checkpoints ------------------------------------------------------------------------------
    def request_save(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the current hook has reached every callback (Note [checkpoint timing])."""
        self._pending.append(fn)

    def run_pending_saves(self) -> None:
        while self._pending:
            self._pending.pop(0)()

    def save_checkpoint(self, path: str | os.PathLike, latest: bool = False) -> Path:
        """Write the full training state to ``path`` (collective: call it on every rank, at a step boundary)."""
        from .state import write_state

        if not self.at_step_boundary:
            raise RuntimeError("save_checkpoint was called in the middle of a gradient accumulation window; call it "
                               "at a step boundary (trainer.at_step_boundary), e.g. via trainer.request_save")
        return write_state(self, path, latest=latest)

    def _pass_done(self) -> bool:
        """True when every batch of the running pass has been consumed (its epoch only lacks its end)."""
        a = self._train_adapter
        return bool(a is not None and self.fitting and a.length() is not None and self._pass_index >= a.length())

    def _data_position(self) -> dict[str, Any] | None:
        a = self._train_adapter
        if a is None:
            return None
        return a.position(self._pass_index) if a.resumable else None

    def _restore(self, path: Path, train: DataAdapter) -> dict[str, Any]:
        from .state import restore_for_fit

        return restore_for_fit(self, path, train)

    def _make_callbacks(self, callbacks, verbose, log_freq, epochs, train, batch_size, history=True) -> CallbackList:
        from .callbacks._build import build_callbacks

        return build_callbacks(self, callbacks, verbose, log_freq, epochs, train, batch_size, history)

    def _to_device(self, batch: Any) -> Any:
        from .data_adapter import to_device

        if self._export_example is None:
            from .export import remember_example

            remember_example(self, batch)

        return to_device(batch, self.device)

    # -- training accumulators ----------------------------------------------------------------------------------
    def _reset_train_accum(self) -> None:
        self._train_accum = {"loss_sum": torch.zeros((), dtype=torch.float64), "count": 0}
        for m in getattr(self, "metrics", []):
            m.reset()

    def _flush_accumulation(self) -> None:
        from ..distributed.fleet.utils import fused_allreduce_gradients

        params = [p for p in self.network.parameters() if p.requires_grad]
        fused_allreduce_gradients(params, None)
        self.at_step_boundary = True
        self.optimizer_step()

    # -- weights, save/load, summary ----------------------------------------------------------------------------
    def get_weights(self) -> dict[str, torch.Tensor]:
        """A copy of the model's state_dict."""
        return {k: v.detach().clone() for k, v in self.network.state_dict().items()}

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        from .connector import strip_compile_prefix

        self.network.load_state_dict(strip_compile_prefix(weights))

    def save(self, path: str | os.PathLike, training: bool = True) -> Path:
        """Save a checkpoint: the full training state, or with ``training=False`` the weights only.

        Collective when ``training`` (every rank calls it; rank 0 writes).
        """
        from .state import save_trainer

        return save_trainer(self, path, training)

    def export(self, path: str | os.PathLike, format: str = "safetensors",
               example_inputs: Sequence[torch.Tensor] | None = None, dynamic_batch: bool = True,
               config: Any = None) -> Path:
        """Export the model for inference: ``safetensors`` weights, a ``torch.export`` ``.pt2`` or ``onnx``.

        The config goes alongside (``<stem>.json``); the batch size stays dynamic. ``example_inputs``
        default to two rows of the first batch fit/evaluate/predict saw; ``config`` (default: the
        Trainer's) is what goes alongside. See :mod:`fleetlite.trainer.export`.
        """
        from .export import trainer_export

        return trainer_export(self, path, format, example_inputs, dynamic_batch, config)

    def load(self, path: str | os.PathLike, skip_mismatch: bool = False, reset_optimizer: bool = False) -> Trainer:
        """Load weights (and the optimizer state unless ``reset_optimizer``) from a checkpoint or weights file.

        ``skip_mismatch`` skips (with a warning) entries whose name or shape
        does not match the model instead of failing. Training progress is not
        restored: use ``fit(resume=path)`` for that.
        """
        from .state import load_weights

        load_weights(self, path, skip_mismatch, reset_optimizer)
        return self

    def summary(self, print_table: bool = True) -> dict[str, Any]:
        """Parameter counts per layer (a rich table on rank 0); returns total/trainable counts and the rows."""
        from .summary import summarize

        return summarize(self.network, print_table=print_table)
