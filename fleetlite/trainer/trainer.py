"""``fleetlite.Trainer``: Keras-style fit/evaluate/predict over the fleet facade (Paddle's ``paddle.Model``).

The loops (and the progress of a fit, read through this class's read-only properties) are in
:mod:`~fleetlite.trainer.fit_loop` and :mod:`~fleetlite.trainer.loops`, what ``fit`` resolves before its loop in
:mod:`~fleetlite.trainer.fit_setup`, data adaptation in :mod:`~fleetlite.trainer.data_adapter`, environment and
wrapping in :mod:`~fleetlite.trainer.connector`, what a checkpoint holds and saving and restoring it in
:mod:`~fleetlite.trainer.checkpoint_connector`. This class holds the model, the steps (override
``train_step``/``eval_step``/``predict_step`` as in Keras) and the public API.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..distributed.fleet import context as fleet_context
from ..io.evaluation import trim_batch
from ..parallel import WrappedModel
from ..utils.weights import strip_compile_prefix
from . import export
from .arguments import check_positive
from .callbacks import EMA, Callback, CallbackList, History
from .checkpoint_connector import CheckpointConnector
from .clipping import clip_gradients
from .config import AgreedConfig, plain_config
from .connector import Connector, unwrap_compiled
from .data_adapter import LimitedAdapter, build_adapter, keras_evaluate_args, to_device
from .fit_loop import FitLoop, FitState
from .fit_setup import FitSetup, as_metrics, resolve_clipping
from .hapi_io import PaddleFiles, paddle_prefix
from .labels import class_index_labels
from .loops import EvaluationLoop, PredictionLoop
from .metrics import Metric
from .predict_writer import PredictionWriter
from .steps import Steps, steps_for
from .summary import summarize
from .weighting import SampleWeights

__all__ = ["Trainer"]


def _progress(name: str, doc: str) -> property:
    """A read-only Trainer property showing ``trainer.fit_state.<name>``."""
    return property(lambda self: getattr(self.fit_state, name), doc=doc)


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
        model, was_compiled = unwrap_compiled(model)  # no _orig_mod. keys (Note [compile in place])
        compile = compile or was_compiled
        self.network: nn.Module = model.module if isinstance(model, WrappedModel) else model
        self._given_model = model
        self.parallel_network: nn.Module | None = None
        self._connector = Connector(strategy, device, compile)
        self._config_agreed = isinstance(config, AgreedConfig)  # compared across ranks already (recipe preflight)
        self.config = plain_config(config)
        self._set_training_objects(optimizer, loss, metrics)
        self.grad_clip: list[Any] = []
        self.fit_state = FitState()  # the progress of fit: one owner (loops move it, checkpoints save it)
        self.stop_training = False  # callbacks set it to end fit at the next step boundary
        self.preempted: str | None = None  # the signal that stopped fit (see fleetlite.callbacks.Preemption)
        self.terminated_on_nan: int | None = None  # the step where TerminateOnNaN stopped fit
        self.save_dir: Path | None = None
        self.weighting = SampleWeights()  # fit's class_weight / sample_weight (fleetlite.trainer.weighting)
        self.example_inputs: tuple[torch.Tensor, ...] | None = None  # two input rows of the first batch, for export
        self.step_evaluations: list[dict[str, Any]] = []  # fit(eval_steps=...)'s evaluations
        self._callbacks: CallbackList | None = None
        self.steps: Steps | None = None  # the wrapped model's step runner, chosen at setup (Note [step runners])
        self.checkpoint_connector = CheckpointConnector(self)  # saves and restores the training state
    # merge_avg: as the strategy says (fleetlite.Model sums, as Paddle)
    merge_avg: bool | None = None

    def _set_training_objects(self, optimizer, loss, metrics) -> None:
        if loss is not None and not callable(loss):
            raise TypeError(f"loss must be callable as loss(outputs, labels), got {type(loss).__name__}")
        self.user_optimizer = optimizer
        self.optimizer = None
        self.loss_fn = loss
        self.metrics: list[Metric] = as_metrics(metrics)

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
            self.ema = EMA(ema_decay)
        self.grad_clip = resolve_clipping(self.grad_clip, optimizer, grad_clip, clipnorm, clipvalue, global_clipnorm)
        if strategy is not None:
            self._connector.set_strategy(strategy, "pass it to the Trainer or to the first compile call")
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
    def world_size(self) -> int:
        return self._connector.world_size

    @property
    def run_dir(self) -> Path:
        """Where run files go: ``fit(save_dir=...)``, else the current directory."""
        return Path(self.save_dir) if self.save_dir is not None else Path.cwd()

    # -- progress: read-only views of ``fit_state`` (the loops move it, checkpoints save it) ----------------------
    epoch = _progress("epoch", "The running (or last) epoch, 0-based.")
    global_step = _progress("global_step", "Optimizer steps taken (a gradient-merge window counts once).")
    batch_in_epoch = _progress("batch_in_epoch", "Batches of the running epoch done.")
    epoch_finished = _progress("epoch_finished", "Whether the running epoch has ended.")
    at_step_boundary = _progress("at_step_boundary", "Whether the running batch ends a gradient-merge window "
                                 "(the optimizer steps; checkpoints are written only there).")
    fitting = _progress("fitting", "Whether fit is running.")

    @property
    def callbacks(self) -> CallbackList | None:
        """The callbacks of the running (or last) ``fit``."""
        return self._callbacks

    def setup(self, training: bool = False) -> None:
        """Start the environment and wrap the model and optimizer now (fit/evaluate/predict do it on first use)."""
        if self.parallel_network is None:
            self._connector.start()
            if not self._config_agreed:  # fail fast, before the model is wrapped
                self._connector.check_same_config(self.config)
            self.parallel_network, self.network = self._connector.setup_model(self._given_model)
        # Note [step runners]: the wrapped model names its runner, chosen once; built apart from the wrapping, so
        # that a retry after its checks failed (a pipeline's two losses) builds it instead of training one stage
        # as if it were the whole model
        if self.steps is None:
            self.steps = steps_for(self, self.parallel_network)
        if training:
            if self.user_optimizer is None:
                raise ValueError("fit needs an optimizer: pass Trainer(model, optimizer, loss) or call "
                                 "compile(optimizer, loss) first")
            if self.loss_fn is None and type(self).train_step is Trainer.train_step and self.steps.needs_loss:
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
        """``loss(outputs, *labels)`` (``loss(*outputs, *labels)`` when the model returns a tuple); ``[N, 1]`` integer
        labels reach torch's ``CrossEntropyLoss``/``NLLLoss`` as ``[N]`` class indices, as Keras' sparse
        categorical cross-entropy takes them (:func:`~fleetlite.trainer.labels.class_index_labels`)."""
        if self.loss_fn is None:
            raise ValueError("no loss function: pass loss=... to the Trainer or compile()")
        outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        if labels:
            return self.loss_fn(*outs, *class_index_labels(self.loss_fn, outs, labels))
        try:  # inputs only: fine for a loss of the outputs alone, else say what is missing
            return self.loss_fn(*outs)
        except TypeError as e:
            raise ValueError(f"the batch has no labels (inputs only), but the loss needs them ({e}): pass inputs "
                             "and labels, e.g. fit((x, y)) or fit(x, y), or a Dataset yielding (input, label); "
                             "or override compute_loss / train_step") from None

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss``, divided for gradient merge (Note [gradient merge window]), scaled for float16 amp."""
        self.optimizer.backward(self.optimizer.merge.scale_loss(loss))

    def optimizer_step(self) -> None:
        """Step the optimizer and clear the gradients; only at a step boundary (gradient merge)."""
        if self.at_step_boundary:
            clip_gradients(self.optimizer, self.network, self.grad_clip)  # Note [clip order]: the step clips them
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def update_metrics(self, outputs: Any, labels: Sequence[Any]) -> None:
        """Feed the real (non-padding) samples of the batch to every metric (Paddle's compute → update)."""
        if not self.metrics:
            return
        outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        n = self.fit_state.batch_valid
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
        ``self.optimizer_step``, ``self.update_metrics``. The step itself is the wrapped model's step runner's
        (Note [step runners] in :mod:`~fleetlite.trainer.steps`): :class:`~fleetlite.trainer.steps.DefaultSteps`,
        or a pipeline model's ``train_batch`` (Note [hybrid trainer]).
        """
        return self.steps.train_step(batch)

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """One evaluation batch (padding already removed, under ``no_grad``): loss and metrics (the step runner's,
        Note [step runners])."""
        return self.steps.eval_step(batch)

    def predict_step(self, batch: Any) -> Any:
        """One prediction batch: the model's outputs for the batch's inputs (labels, if present, ignored); on a
        pipeline the last stage's outputs, None on the other stages (the step runner's, Note [step runners])."""
        return self.steps.predict_step(batch)

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

        ``resume``: ``"latest"`` (newest valid checkpoint in ``save_dir``, falling back with a warning), ``"auto"``
        (same, or a fresh start), a checkpoint file, or a directory; ``None`` starts fresh and warns when ``save_dir``
        already holds an earlier run's checkpoints (they get overwritten), ``False`` starts fresh without a word.
        Everything is restored, mid-epoch included (Note [resume order] in :mod:`~.checkpoint_connector`).
        ``num_iters`` caps the total optimizer steps; ``seed`` seeds the shuffle of a Dataset. (Preparation:
        :mod:`~.fit_setup`.)

        The logged training ``loss`` is the optimized one: batch means weighted by batch size, so on several ranks
        it includes the samples a DistributedBatchSampler repeats to fill the last batches (e.g. 0.79875 on 2 ranks
        where one process logs 0.80074); training metrics, ``val_*`` and ``evaluate`` count real samples only.
        """
        self.terminated_on_nan = None
        self.save_dir = Path(save_dir) if save_dir is not None else None  # the run's directory (callbacks read it)
        fit = FitSetup.prepare(
            self, train_data, eval_data, epochs, batch_size, eval_freq, log_freq, callbacks, shuffle, drop_last,
            num_workers, accumulate_grad_batches, num_iters, resume, verbose, seed,
            validation_split=validation_split, steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
            initial_epoch=initial_epoch, eval_steps=eval_steps, class_weight=class_weight,
            sample_weight=sample_weight)
        self.weighting, self._callbacks = fit.weighting, fit.callbacks
        FitLoop(self, fit.train, fit.evaluation, fit.plan, fit.callbacks).run(fit.resume)
        return fit.callbacks.find(History)[0]

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None, verbose: int = 1,
                 sample_weight: Any = None, steps: int | None = None, callbacks: Sequence[Callback] | None = None,
                 return_dict: bool = True, *, log_freq: int = 10, num_workers: int = 0) -> Any:
        """Loss and metrics over ``x`` (data, or inputs with labels ``y``), exact across ranks (each sample once).

        Keras' positional order: ``evaluate(x, y, batch_size, verbose, sample_weight, steps, callbacks,
        return_dict)``; ``batch_size`` defaults to 32 (a pipeline model's rows per step) and ``steps`` evaluates
        the first ``steps`` batches of each rank. Unlike Keras, ``return_dict`` defaults to True (the logs dict);
        ``False`` gives Keras' scalar loss or ``[loss, *metrics]``.
        """
        if x is None:
            raise TypeError("evaluate() needs data: evaluate(x, y), evaluate((x, y)), a Dataset or a DataLoader")
        eval_data, _ = keras_evaluate_args(x, y) if y is not None else (x, None)
        if y is not None and eval_data is x:
            raise TypeError(f"evaluate(x, y): y must be the labels tensor of x, got {type(y).__name__}; pass "
                            "numbers by keyword (evaluate(data, batch_size=64))")
        if sample_weight is not None:
            raise NotImplementedError("evaluate(sample_weight=...) is not supported: the evaluation loss is the "
                                      "plain mean over samples; weight it in an overridden eval_step")
        self.setup()
        batch_size = self._default_batch_size(batch_size)
        check_positive(batch_size=batch_size, log_freq=log_freq, **({} if steps is None else {"steps": steps}))
        pin = self.device.type == "cuda"  # pinned host batches: the non-blocking copy overlaps compute
        data = build_adapter(eval_data, batch_size, num_workers=num_workers, pin_memory=pin, role="eval")
        self.steps.check_inference(data, "evaluation")
        if steps is not None:
            data = LimitedAdapter.wrap(data, steps)
        cbs = CallbackList.for_call(callbacks, self, verbose=verbose, log_freq=log_freq, epochs=1,
                                    batch_size=batch_size, history=False)
        logs = EvaluationLoop(self).run(data, cbs)
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def predict(self, x: Any, batch_size: int | None = None, verbose: int = 0, steps: int | None = None,
                callbacks: Sequence[Callback] | None = None, *, stack_outputs: bool = False, num_workers: int = 0,
                output_dir: str | os.PathLike | None = None) -> Any:
        """Model outputs for ``x`` in dataset order, gathered across ranks without duplicates.

        Keras' positional order: ``predict(x, batch_size, verbose, steps, callbacks)`` (``batch_size`` defaults
        to 32, a pipeline model's rows per step; ``steps``: the first ``steps`` batches of each rank). Returns, for a
        model with one output, a list of batch tensors (one tensor with ``stack_outputs=True``); for several
        outputs, a list with one such entry per output (Paddle's layout). Outputs whose non-batch dims differ
        between batches come back batch by batch (Note [predict batches]). ``output_dir``: stream the outputs to
        disk instead (memory independent of the data size) and return the merged ``.npy`` paths (Note [streamed
        predictions]).
        """
        self.setup()
        batch_size = self._default_batch_size(batch_size)
        check_positive(batch_size=batch_size, **({} if steps is None else {"steps": steps}))
        pin = self.device.type == "cuda"
        adapter = build_adapter(x, batch_size, num_workers=num_workers, pin_memory=pin, role="predict")
        self.steps.check_inference(adapter, "prediction")
        if steps is not None:
            adapter = LimitedAdapter.wrap(adapter, steps)
        cbs = CallbackList.for_call(callbacks, self, verbose=verbose, log_freq=10, epochs=1, batch_size=batch_size,
                                    history=False)
        writer = None
        if output_dir is not None:
            writer = PredictionWriter(output_dir, self._connector.rank, self._connector.world_size)
        return PredictionLoop(self).run(adapter, batch_size, stack_outputs, cbs, writer)

    def _default_batch_size(self, batch_size: int | None) -> int:
        """The step runner's rows: 32 (Keras), or a pipeline's ``accumulate_steps * micro_batch_size`` (the rows it
        runs at once)."""
        return self.steps.rows if batch_size is None else batch_size

    def eval_due(self, epoch: int, eval_freq: int) -> bool:
        """Evaluate after ``epoch`` (0-based)? Keras: every ``eval_freq``-th epoch; ``fleetlite.Model``: Paddle's."""
        return (epoch + 1) % eval_freq == 0

    # -- callbacks and checkpoints ------------------------------------------------------------------------------
    def request_save(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the current hook has reached every callback (Note [checkpoint timing])."""
        self.checkpoint_connector.request(fn)

    def run_pending_saves(self) -> None:
        """Run the requested saves; after a non-finite loss stopped fit they are dropped (the weights are broken)."""
        self.checkpoint_connector.run_requests()

    @contextlib.contextmanager
    def metrics_in_use(self, metrics: list[Metric]) -> Iterator[None]:
        """Fill ``metrics`` instead of the Trainer's inside the block (a mid-epoch evaluation's copies)."""
        saved, self.metrics = self.metrics, metrics
        try:
            yield
        finally:
            self.metrics = saved

    def save_checkpoint(self, path: str | os.PathLike, latest: bool = False) -> Path:
        """Write the full training state to ``path`` (collective: call it on every rank, at a step boundary)."""
        if not self.at_step_boundary:
            raise RuntimeError("save_checkpoint was called in the middle of a gradient accumulation window; call it "
                               "at a step boundary (trainer.at_step_boundary), e.g. via trainer.request_save")
        return self.checkpoint_connector.save(path, latest=latest)

    def to_device(self, batch: Any) -> Any:
        """The batch on the Trainer's device (the first batch's two rows are kept as ``example_inputs``)."""
        if self.example_inputs is None:
            self.example_inputs = export.example_inputs_of_batch(self.split_batch, batch)
        return to_device(batch, self.device)

    # -- weights, save/load, summary ----------------------------------------------------------------------------
    def get_weights(self) -> dict[str, torch.Tensor]:
        """A copy of the model's full state_dict (collective under sharding stage 2/3 and for a tensor- or
        pipeline-parallel model: gathered on every rank, also before ``fit``)."""
        self._setup_if_hybrid()
        return self.checkpoint_connector.full_weights()

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a full state_dict (every rank passes it; under stage 2/3 each rank keeps its shards, a tensor-
        or pipeline-parallel model its slices and stages)."""
        self._setup_if_hybrid()
        self.checkpoint_connector.load_model_state(strip_compile_prefix(weights))

    def _setup_if_hybrid(self) -> None:
        """Wrap the model now where fleet's plan splits models across ranks (tensor-parallel slices, pipeline
        stages): only the wrapped model gathers them into full weights (before, its state_dict is this rank's)."""
        plan = fleet_context.state.plan  # the plan answers, not the model's parameters
        if self.parallel_network is None and plan is not None and (plan.mp_enabled or plan.pp_enabled):
            self.setup()

    def save(self, path: str | os.PathLike, training: bool = True) -> Path:
        """Save a checkpoint: the full training state, or with ``training=False`` the weights only.

        Collective when ``training`` (every rank calls it; rank 0 writes).
        """
        path = Path(path)
        path = path.with_suffix(".pt") if path.suffix == "" else path
        if not training:
            return self.checkpoint_connector.save_weights(path)
        self.setup()
        return self.checkpoint_connector.save(path)

    def export(self, path: str | os.PathLike, format: str = "safetensors",
               example_inputs: Sequence[torch.Tensor] | None = None, dynamic_batch: bool = True,
               config: Any = None) -> Path:
        """Export the model for inference: ``safetensors`` weights, a ``torch.export`` ``.pt2`` or ``onnx``.

        The config (default: the Trainer's) goes alongside (``<stem>.json``); the batch size stays dynamic.
        ``example_inputs`` default to two rows of the first batch seen. See :mod:`fleetlite.trainer.export`.
        """
        example = tuple(example_inputs) if example_inputs is not None else (self.example_inputs or None)
        net = self.parallel_network  # (None before setup: a plain model)
        gather = self.checkpoint_connector.model_state if net is not None and net.is_sharded else None
        return export.export_collective(self.network, path, format, example, self.config if config is None else config,
                                        dynamic_batch, gather)

    def load(self, path: str | os.PathLike, skip_mismatch: bool = False, reset_optimizer: bool = False) -> Trainer:
        """Load weights (and the optimizer state unless ``reset_optimizer``) from any checkpoint ``fit`` writes (a
        file, a sharded checkpoint directory, the ``latest`` pointer, a run's checkpoint directory) or a weights file.

        Paddle's files load too: ``{path}.pdparams`` (and ``.pdopt``) by its prefix, and a Paddle ``fit(save_dir=...)``
        directory (its ``final``, else its last epoch).

        ``skip_mismatch`` skips (with a warning) entries whose name or shape does not match the model instead of
        failing. Training progress is not restored: use ``fit(resume=path)`` for that.
        """
        prefix = paddle_prefix(path)
        if prefix is not None:
            PaddleFiles(self).load(prefix, skip_mismatch, reset_optimizer, other=self.checkpoint_connector.load)
            return self
        self.checkpoint_connector.load(path, skip_mismatch, reset_optimizer)
        return self

    def summary(self, print_table: bool = True) -> dict[str, Any]:
        """Parameter counts per layer (a rich table on rank 0); returns total/trainable counts and the rows."""
        return summarize(self.network, print_table=print_table)
