"""``fleetlite.Model``: Paddle's ``paddle.Model`` (hapi), exactly, as a thin layer over the Trainer.

Same names, positional order, defaults, schedules and return layouts as
Paddle's ``python/paddle/hapi/model.py``; the training machinery (data
adapters, distributed engine, exact metrics, checkpoints) is the Trainer's.
Differences from :class:`fleetlite.Trainer` (the Keras-style face):

=====================  ===================================  ==========================================
                       ``fleetlite.Model`` (Paddle)          ``fleetlite.Trainer`` (Keras/torch)
=====================  ===================================  ==========================================
fit order / defaults   ``(train_data, eval_data,            ``(train_data, eval_data, epochs=1,
                       batch_size=1, epochs=1, ...)``        batch_size=32, ...)``
evaluation schedule    after epochs with                    after epochs with
                       ``epoch % eval_freq == 0``            ``(epoch + 1) % eval_freq == 0``
``fit(save_dir)``      ``{save_dir}/{epoch}.pdparams/.pdopt`` full-state ``epoch-NNNN.pt``, ``latest.pt``
                       (``epoch % save_freq == 0``), ``final``
LR scheduler           stepped after every batch (also        only with an ``LRScheduler`` callback
                       inside an accumulation window, as     (per optimizer step or per epoch)
                       Paddle; ``LRScheduler()`` added)
gradient accumulation  gradients summed (Paddle)             mean over the micro-batches
``evaluate`` result    ``{'loss': [value], 'acc': ...}``     ``{'loss': value, 'acc': ...}``
batch/predict outputs  numpy arrays                          torch tensors
callbacks              ``fleetlite.callbacks`` (Paddle's)    ``fleetlite.trainer.callbacks`` (Keras')
=====================  ===================================  ==========================================

Each callback works under either face and behaves as its class says (Paddle's ``EarlyStopping`` acts on the
evaluation logs, ``'loss'``; Keras' on the epoch logs, ``'val_loss'``). The evaluation loss is the mean over
every sample (Paddle reports the last batch's loss); it is exact across ranks, as the metrics are.

Example::

    import torch, fleetlite
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    model = fleetlite.Model(net)
    model.prepare(torch.optim.Adam(net.parameters(), 1e-3), torch.nn.CrossEntropyLoss(),
                  fleetlite.metric.Accuracy())
    model.fit(train_set, val_set, 64, 2)            # Paddle's positional order: batch_size, epochs
    print(model.evaluate(val_set, batch_size=64))   # {'loss': [...], 'acc': ...}
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from .callbacks import Callback, ProgBarLogger, ProgressBar
from .callbacks.paddle.config import paddle_fit_callbacks
from .clipping import clip_gradients, resolve_grad_clip
from .data_adapter import DataAdapter, LimitedAdapter, build_adapter
from .export import example_inputs_of
from .hapi_amp import amp_strategy
from .hapi_io import PaddleFiles, spec_inputs
from .hapi_trainer import HapiTrainer, to_list
from .keras_fit import check_call_order
from .metrics import Metric
from .summary import summary
from .torchmetrics_adapter import is_torchmetric
from .trainer import Trainer

__all__ = ["Model", "check_call_order"]

def _numpy(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    if isinstance(x, (list, tuple)):
        return [_numpy(v) for v in x]
    return x


def _verify_spec(specs: Any, kind: str) -> list | None:
    if specs is None:
        return None
    specs = to_list(specs)
    for i, s in enumerate(specs):
        if getattr(s, "name", "") is None:
            raise ValueError(f"Model({kind}=...): {kind}[{i}] needs a name (Paddle's rule for InputSpec), got "
                             f"{s!r}; give it one, e.g. InputSpec([None, 784], 'float32', 'x')")
    return specs


def _with_progbar(callbacks: Any, log_freq: int, verbose: int) -> list[Callback]:
    """The user's callbacks with Paddle's ``ProgBarLogger(log_freq, verbose)`` first (unless a display is given)."""
    cbks = to_list(callbacks)
    if verbose and not any(isinstance(k, ProgressBar) for k in cbks):
        cbks = [ProgBarLogger(log_freq, verbose=verbose), *cbks]
    return cbks


class Model:
    """Paddle's ``paddle.Model`` (see the module docstring for the differences from the Trainer).

    A thin class over the shared machinery: a :class:`~fleetlite.Trainer` (``model.trainer``) runs the loops,
    the distributed engine, metrics and checkpoints; this class holds Paddle's API (names, positional order,
    defaults, return layouts).

    Args:
        network: the ``nn.Module``.
        inputs: Paddle's input specs (objects with ``shape``, ``dtype``, ``name``; a name is required), or None.
            Their number decides how a batch splits into inputs and labels (without them: the number of
            positional arguments of ``network.forward``).
        labels: label specs, or None.

    Example::

        model = fleetlite.Model(net)
        model.prepare(opt, torch.nn.CrossEntropyLoss(), fleetlite.metric.Accuracy(topk=(1, 2)))
        losses, metrics = model.train_batch([x_numpy], [y_numpy])
        (out,) = model.predict_batch([x_numpy])
    """

    def __init__(self, network: nn.Module, inputs: Any = None, labels: Any = None) -> None:
        self._inputs = _verify_spec(inputs, "inputs")
        self._labels = _verify_spec(labels, "labels")
        self._trainer = HapiTrainer(network, len(self._inputs) if self._inputs is not None else None)
        self._ran = False
        self._amp_level = "O0"

    # -- the shared machinery and Paddle's attribute names ---------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        """The :class:`~fleetlite.Trainer` that runs this model (callbacks see it as ``self.model``)."""
        return self._trainer

    @property
    def network(self) -> nn.Module:
        return self._trainer.network

    @property
    def stop_training(self) -> bool:
        return self._trainer.stop_training

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        self._trainer.stop_training = value

    @property
    def _optimizer(self):
        return self._trainer.user_optimizer

    @property
    def _loss(self):
        return self._trainer.loss_fn

    @property
    def _metrics(self):
        return self._trainer.metrics

    def _metrics_name(self) -> list[str]:
        t = self._trainer
        return (["loss"] if t.loss_fn is not None else []) + [n for m in t.metrics for n in m.names()]

    def parameters(self, *args, **kwargs) -> list[nn.Parameter]:
        """The network's parameters, as a list (Paddle)."""
        return list(self.network.parameters(*args, **kwargs))

    # -- prepare ---------------------------------------------------------------------------------------------
    def prepare(self, optimizer: torch.optim.Optimizer | None = None, loss: Callable[..., Any] | None = None,
                metrics: Any = None, amp_configs: str | dict[str, Any] | None = None, *,
                grad_clip: Any = None) -> None:
        """Set optimizer, loss, metrics and mixed precision; each call replaces all four (as Paddle).

        ``amp_configs``: ``'O0'``/``'O1'``/``'O2'`` or a dict with ``level`` and Paddle's scaler keys
        (``init_loss_scaling``, ``incr_ratio``, ...); anything else raises ValueError. Mixed precision needs
        a GPU: on a CPU device it is switched off with a warning. ``grad_clip``: a ``ClipGradBy*`` object
        (Paddle gives it to the optimizer; here also read from ``optimizer._grad_clip``).
        """
        if loss is not None and not callable(loss):
            raise TypeError("'loss' must be a torch.nn.Module or any callable function, got "
                            f"{type(loss).__name__}")
        for m in to_list(metrics):
            if not (isinstance(m, Metric) or is_torchmetric(m)):
                raise AssertionError(f"{type(m).__name__} is not sub class of Metric")
        t = self._trainer
        self._amp_level, strategy = amp_strategy(amp_configs, t.device)
        t.compile(optimizer, loss, to_list(metrics) or None, strategy)
        # Paddle replaces all four: what was not passed is unset (compile keeps it)
        if optimizer is None:
            t.user_optimizer, t.optimizer = None, None
        if loss is None:
            t.loss_fn = None
        if not to_list(metrics):
            t.metrics = []
        t.grad_clip = resolve_grad_clip(grad_clip if grad_clip is not None else getattr(optimizer, "_grad_clip",
                                                                                           None))

    # -- batches ---------------------------------------------------------------------------------------------
    def _batch_tensors(self, values: Any) -> list[torch.Tensor]:
        out = []
        for v in to_list(values):
            t = torch.from_numpy(np.asarray(v)) if not isinstance(v, torch.Tensor) else v
            out.append(t.to(self._trainer.device))
        return out

    def _batch_inputs(self, values: Any) -> list[torch.Tensor]:
        """The batch's inputs as tensors; the first batch's two rows are kept for ``save(training=False)``."""
        inputs = self._batch_tensors(values)
        if self._trainer.example_inputs is None:
            self._trainer.example_inputs = example_inputs_of(inputs)
        return inputs

    def _batch_metrics(self, outputs: Any, labels: list[torch.Tensor]) -> list[Any]:
        res = []
        outs = [o.detach() for o in to_list(outputs)]
        for m in self._trainer.metrics:
            r = m.compute(*outs, *labels)
            res.append(m.update(*to_list(r)))
        return res

    def _per_batch(self, what: str, training: bool = False) -> None:
        """Set up; a step runner without a whole-model forward (a pipeline's) refuses Paddle's per-batch calls."""
        self._trainer.setup(training=training)
        self._trainer.steps.check_per_batch(what)

    def train_batch(self, inputs: Any, labels: Any = None, update: bool = True) -> Any:
        """One training step on a batch (numpy or tensors); ``update=False`` only accumulates gradients.

        Returns ``[loss]`` (numpy), or ``([loss], [metric values])`` with metrics (Paddle's layout).
        """
        t = self._trainer
        self._per_batch("train_batch", training=True)
        inputs, labels = self._batch_inputs(inputs), self._batch_tensors(labels)
        self._ran = True
        t.parallel_network.train()
        merge = t.optimizer.merge
        with merge.driven(k=1):  # Paddle: each call's gradients are synced, update=True steps (no merge window)
            merge.begin(last=True)
            outputs = t.parallel_network(*inputs)
            loss = t.compute_loss(outputs, labels)
            t.optimizer.backward(loss)
            if update:
                clip_gradients(t.optimizer, t.network, t.grad_clip)  # Note [who clips]: the step clips them
                t.optimizer.step()
                t.optimizer.zero_grad(set_to_none=False)  # Paddle's clear_gradients: zeros
        losses = [_numpy(loss).reshape(1)]
        metrics = self._batch_metrics(outputs, labels)
        return (losses, metrics) if metrics else losses

    @torch.no_grad()
    def eval_batch(self, inputs: Any, labels: Any = None) -> Any:
        """Loss and metrics on a batch without training (Paddle's layout, as :meth:`train_batch`)."""
        t = self._trainer
        self._per_batch("eval_batch")
        inputs, labels = self._batch_inputs(inputs), self._batch_tensors(labels)
        self._ran = True
        t.network.eval()
        outputs = t.network(*inputs)
        metrics = self._batch_metrics(outputs, labels)
        if t.loss_fn is None:
            return metrics
        losses = [_numpy(t.compute_loss(outputs, labels)).reshape(1)]
        return (losses, metrics) if metrics else losses

    @torch.no_grad()
    def predict_batch(self, inputs: Any) -> list[np.ndarray]:
        """The model's outputs for a batch, one numpy array per output."""
        t = self._trainer
        self._per_batch("predict_batch")
        inputs = self._batch_inputs(inputs)
        self._ran = True
        t.network.eval()
        return [_numpy(o) for o in to_list(t.network(*inputs))]

    # -- loops -----------------------------------------------------------------------------------------------
    def fit(self, train_data: Any = None, eval_data: Any = None, batch_size: int | Sequence[int] = 1,
            epochs: int = 1, eval_freq: int = 1, log_freq: int = 10, save_dir: str | None = None,
            save_freq: int = 1, verbose: int = 2, drop_last: bool = False, shuffle: bool = True,
            num_workers: int = 0, callbacks: Any = None, accumulate_grad_batches: int = 1,
            num_iters: int | None = None):
        """Paddle's ``Model.fit`` (same order and defaults); returns the History (Paddle returns None).

        ``batch_size`` may be ``(train_batch_size, eval_batch_size)``; ``callbacks`` one callback or a list.
        Paddle's defaults are added (``config_callbacks``): a ``ProgBarLogger``, a
        ``ModelCheckpoint(save_freq, save_dir)`` (``{save_dir}/{epoch}`` when ``epoch % save_freq == 0``,
        ``{save_dir}/final``) and an ``LRScheduler()`` stepping the optimizer's scheduler after every batch;
        Paddle's ``EarlyStopping`` saves ``{save_dir}/best_model``.
        """
        if train_data is None:
            raise ValueError("train_data must be given!")
        check_call_order(train_data, eval_data, batch_size, epochs, "paddle")
        if isinstance(batch_size, (tuple, list)) and all(isinstance(x, int) for x in batch_size):
            if len(batch_size) != 2:
                raise ValueError("batch_size length error, expected train_batch_size and eval_batch_size.")
            train_bs, eval_bs = batch_size
        elif isinstance(batch_size, int):
            train_bs = eval_bs = batch_size
        else:
            raise TypeError("'batch_size' must be integer or tuple/list of two integers")
        t = self._trainer
        if eval_data is not None and not isinstance(eval_data, DataAdapter):
            eval_data = build_adapter(eval_data, batch_size=eval_bs, num_workers=num_workers,
                                      pin_memory=t.device.type == "cuda", role="eval")
        cbs = paddle_fit_callbacks(callbacks, save_dir, save_freq, log_freq, verbose)
        self._ran = True
        return t.fit(train_data, eval_data, epochs=epochs, batch_size=train_bs, eval_freq=eval_freq,
                     log_freq=log_freq, callbacks=cbs, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers,
                     accumulate_grad_batches=accumulate_grad_batches, num_iters=num_iters, verbose=verbose)

    def evaluate(self, eval_data: Any, batch_size: int = 1, log_freq: int = 10, verbose: int = 2,
                 num_workers: int = 0, callbacks: Any = None, num_iters: int | None = None) -> dict[str, Any]:
        """Paddle's ``Model.evaluate``: ``{'loss': [mean loss], <metric names>: values}``.

        ``num_iters`` evaluates only the first ``num_iters`` batches (of each rank).
        """
        check_call_order(None, eval_data, batch_size, 1, "paddle")
        if num_iters is not None:
            data = build_adapter(eval_data, batch_size=batch_size, num_workers=num_workers, role="eval")
            eval_data = LimitedAdapter.wrap(data, num_iters)
        self._ran = True
        logs = self._trainer.evaluate(eval_data, batch_size=batch_size, log_freq=log_freq,
                                      callbacks=_with_progbar(callbacks, log_freq, verbose), num_workers=num_workers,
                                      verbose=verbose)
        result = {}
        for k in self._metrics_name():
            if k in logs:
                result[k] = [logs[k]] if k == "loss" else logs[k]
        return result

    def predict(self, test_data: Any, batch_size: int = 1, num_workers: int = 0, stack_outputs: bool = False,
                verbose: int = 1, callbacks: Any = None) -> list:
        """Paddle's ``Model.predict``: a list with one entry per model output (also for one output), each a
        list of per-batch numpy arrays, or one stacked array with ``stack_outputs=True``."""
        self._ran = True
        out = self._trainer.predict(test_data, batch_size=batch_size, stack_outputs=stack_outputs,
                                    num_workers=num_workers, callbacks=_with_progbar(callbacks, 10, verbose),
                                    verbose=verbose)
        if stack_outputs:
            columns = [out] if isinstance(out, torch.Tensor) else list(out)
        else:
            columns = [out] if out and isinstance(out[0], torch.Tensor) else list(out)
        return _numpy(columns)

    # -- save / load -----------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, training: bool = True) -> None:
        """Paddle's ``Model.save``: ``path`` is a file prefix (also when a directory of that name exists).

        ``training=True`` writes ``{path}.pdparams`` (weights) and ``{path}.pdopt`` (optimizer state, with the
        amp loss scaler), torch pickles written atomically by rank 0; collective: under a distributed run every
        rank calls it (as ``fit``'s callbacks do), sharded states are gathered.

        ``training=False`` writes a deployable inference program, as Paddle's ``paddle.jit.save`` does:
        ``{path}.pt2`` holds a ``torch.export`` program (``torch.export.save``; Paddle names its program
        ``{path}.pdmodel``, torch's loader expects ``.pt2``) of the network in eval mode, any batch size, that
        runs without the model's class (``torch.export.load(path + ".pt2").module()(x)`` equals
        :meth:`predict_batch`); traced from the
        ``inputs`` specs (free dimensions as 2) or else the first batch the model saw. Next to it
        ``{path}.pt`` holds the weights (as ``fleetlite.Trainer.save(path, training=False)``), which
        :meth:`load` reads back. Needs the model to have run or ``inputs`` specs (RuntimeError otherwise, as
        Paddle). Under sharding stage 2/3 only ``{path}.pt`` is written, with a warning.

        Example::

            model.save("infer/mnist", training=False)       # infer/mnist.pt2 + infer/mnist.pt
            prog = torch.export.load("infer/mnist.pt2").module()   # no model class needed
        """
        path = os.fspath(path)
        if training:
            self._trainer.save(path)
            return
        if os.path.basename(path) == "":
            raise ValueError(f"The input path MUST be format of dirname/file_prefix [dirname\\file_prefix in "
                             f"Windows system], but received file_prefix is empty string: {path!r}")
        if not self._ran and self._inputs is None:
            raise RuntimeError("Model.save(training=False) needs the input shapes: pass Model(net, inputs=[...]) "
                               "or run the model first (fit, evaluate, predict or a *_batch call)")
        t = self._trainer
        t.setup()
        t.save(path, training=False)  # the Trainer's inference weights file, {path}.pt: Model.load reads it
        example = spec_inputs(self._inputs) if self._inputs is not None else t.example_inputs
        PaddleFiles(t).save_program(path, tuple(example))  # {path}.pt2: the torch.export program

    def load(self, path: str | os.PathLike, skip_mismatch: bool = False, reset_optimizer: bool = False) -> None:
        """Paddle's ``Model.load`` of ``{path}.pdparams`` (and ``.pdopt`` unless ``reset_optimizer``).

        Entries missing from the file or of another shape raise ValueError, or with ``skip_mismatch`` are
        skipped with a warning. What ``save(path, training=False)`` wrote (``{path}.pt``) and a fleetlite
        checkpoint file are accepted too. Every file is read with ``weights_only=True`` (no code runs).
        """
        self._trainer.load(path, skip_mismatch, reset_optimizer)

    def summary(self, input_size: Any = None, dtype: Any = None) -> dict[str, int]:
        """Paddle's ``Model.summary``: per-layer table; returns ``{'total_params', 'trainable_params'}``."""
        if input_size is None and self._inputs is not None:
            input_size = [tuple(getattr(s, "shape", s)) for s in self._inputs]
        return summary(self.network, input_size, dtypes=dtype)
