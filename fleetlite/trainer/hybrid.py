"""How the Trainer runs hybrid-parallel models (``strategy.hybrid_configs`` with ``mp_degree``/``pp_degree`` > 1).

# Note [hybrid trainer]
Tensor parallel (``TensorParallel``, the data-parallel engine over the dp × sharding group): the Trainer's
steps run unchanged. What differs is where the data is split and summed (Note [data group]: the dp ×
sharding group, so the ranks of one tensor-parallel group read the same batches and are not counted twice)
and clipping (the global norm of the whole model, each parameter once across dp, sharding, mp and pp:
:mod:`~.clipping`).

Pipeline (``PipelineParallel``, which declares ``step_runner = "pipeline"``): no rank holds the whole model's
forward, so its step runner :class:`PipelineSteps` (Note [step runners] in :mod:`~fleetlite.trainer.steps`) runs
the Trainer's steps through the pipeline's own. Training: ``train_batch`` (its micro-batches are the gradient
accumulation: ``accumulate_grad_batches`` and gradient merge are refused) with, as its optimizer, the
Trainer's ``optimizer_step`` (the Trainer's clipping, the DistributedOptimizer's amp and hybrid clip); the
logged loss is the pipeline's mean loss (the same on every stage); training metrics are computed on the last
stage from the micro-batch outputs (a forward hook on its stage, in training only). Evaluation and prediction:
``eval_batch`` on a batch padded to the pipeline's ``accumulate_steps * micro_batch_size`` rows (repeats of
its first row; the padded rows' outputs are dropped), so a short last batch works; loss and metrics are
computed on the last stage, reduced over its data group, and the logs (or predictions) sent to the other
stages, so every rank returns the same. Every batch must have exactly the pipeline's rows in training (checked
before the first step) and at most that many in evaluation and prediction; the outputs' first dimension must
be the batch.

Example::

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}
    strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": 4}
    trainer = fleetlite.Trainer(pipeline_layer, opt, strategy=strategy)
    trainer.fit(data, batch_size=8)          # 8 = accumulate_steps * micro_batch_size
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as td

from ..distributed.fleet.data_group import data_group
from ..io.evaluation import trim_batch
from ..parallel.comm import broadcast_coalesced
from .data_adapter import DataAdapter, batch_length

__all__ = ["PipelineSteps"]


def _pack(values: tuple[Any, ...]) -> Any:
    """The Trainer's (inputs or labels) tuple as ``train_batch`` takes it: one value alone, else the tuple."""
    return values[0] if len(values) == 1 else tuple(values)


def _pad(value: Any, rows: int) -> Any:
    """``value`` with its first dimension padded to ``rows`` by repeating its first row (tensors, nested)."""
    if isinstance(value, torch.Tensor):
        n = value.shape[0] if value.dim() else 0
        if value.dim() == 0 or n >= rows:
            return value
        return torch.cat([value, value[:1].expand(rows - n, *value.shape[1:])])
    if isinstance(value, (tuple, list)):
        return type(value)(_pad(v, rows) for v in value)
    return value


def _cat(outputs: list[Any]) -> Any:
    """The micro-batches' outputs (tensors or tuples of them) as one batch, detached."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat([o.detach() for o in outputs])
    if isinstance(first, (tuple, list)):
        return type(first)(_cat([o[k] for o in outputs]) for k in range(len(first)))
    return first


class _TrainerStep:
    """What ``train_batch`` steps as its optimizer: the Trainer's ``optimizer_step`` (its clippers run in the
    DistributedOptimizer's step, with its amp: Notes [clip order], [who clips]). ``train_batch`` itself then
    clips nothing (no ``_grad_clip``)."""

    _grad_clip = None

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def step(self) -> None:
        self.trainer.optimizer_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.trainer.optimizer.zero_grad(set_to_none=set_to_none)


class PipelineSteps:
    """The Trainer's train/eval/predict steps on a ``PipelineParallel``: the step runner its ``step_runner =
    "pipeline"`` names (Note [step runners] in :mod:`~fleetlite.trainer.steps`; Note [hybrid trainer]).

    Example::

        steps = PipelineSteps(trainer, trainer.parallel_network)
        steps.rows          # accumulate_steps * micro_batch_size: every training batch's size
    """

    needs_loss = False  # the PipelineLayer's loss_fn, or the Trainer's given to it (checked by check_fit)

    def __init__(self, trainer, net) -> None:
        self.trainer, self.net = trainer, net
        self.rows = int(net.accumulate_steps) * int(net.micro_batch_size)
        self.has_outputs = bool(net.is_pipeline_last_stage)  # the last stage computes outputs, loss and metrics
        self.last_rank = net.last_stage_rank  # the pipeline answers where its results are
        self._adopt_loss()

    def _adopt_loss(self) -> None:
        """One loss: the PipelineLayer's ``loss_fn`` (what ``train_batch`` optimizes), or the Trainer's given to it."""
        t, layer = self.trainer, self.net.module
        mine = getattr(layer, "_loss_fn", None)
        if mine is None and t.loss_fn is not None:
            layer._loss_fn = t.loss_fn  # Paddle's attribute: train_batch calls it per micro-batch
        elif mine is not None and t.loss_fn is not None and t.loss_fn is not mine:
            raise ValueError("the Trainer's loss and the PipelineLayer's loss_fn differ; a pipeline trains with "
                             "one loss: give it once, as PipelineLayer(..., loss_fn=...) or as the Trainer's loss")
        t.loss_fn = layer._loss_fn

    # -- checks, before any step ---------------------------------------------------------------------------------
    def check_fit(self, train: DataAdapter, accumulate: int, weighted: bool) -> None:
        """Refuse what a pipeline cannot train, before the first step (one line each)."""
        self._adopt_loss()  # (compile may have changed the loss since setup)
        if accumulate > 1:
            raise ValueError(f"accumulate_grad_batches / gradient_merge k_steps = {accumulate} with a pipeline model: "
                             "the pipeline already accumulates its micro-batches; set "
                             "strategy.pipeline_configs['accumulate_steps'] instead")
        if weighted:
            raise ValueError("class_weight / sample_weight with a pipeline model: its PipelineLayer's loss_fn "
                             "computes the loss per micro-batch; weight the samples inside that loss_fn")
        if self.trainer.loss_fn is None:
            raise ValueError("fit of a pipeline model needs a loss: PipelineLayer(..., loss_fn=...) or the "
                             "Trainer's loss=")
        sizes = self._batch_sizes(train)
        bad = sorted(s for s in sizes if s != self.rows)
        if bad:
            raise ValueError(f"training batches of {bad[0]} rows per data-parallel rank, but the pipeline takes "
                             f"accumulate_steps * micro_batch_size = {self.net.accumulate_steps} * "
                             f"{self.net.micro_batch_size} = {self.rows} rows per step; use batch_size={self.rows} "
                             "(and drop_last=True when the data is not a multiple of it) or change "
                             "strategy.pipeline_configs")

    def check_inference(self, data: DataAdapter, role: str) -> None:
        """Evaluation/prediction batches may be short (padded), never longer than the pipeline's rows."""
        big = sorted(s for s in self._batch_sizes(data) if s > self.rows)
        if big:
            raise ValueError(f"{role} batches of {big[-1]} rows, but the pipeline runs at most accumulate_steps * "
                             f"micro_batch_size = {self.rows} rows at once; use batch_size <= {self.rows}")

    def check_per_batch(self, what: str) -> None:
        """``fleetlite.Model``'s per-batch calls: refused, a rank holds one stage and cannot run a batch alone."""
        raise NotImplementedError(f"Model.{what} of a pipeline model (PipelineLayer): a rank holds one stage, "
                                  "so it cannot run the batch alone; use fit / evaluate / predict, which run "
                                  "the pipeline's schedule")

    @staticmethod
    def _batch_sizes(data: DataAdapter) -> set[int]:
        """The local batch sizes of the next pass, where the data can tell them without reading it."""
        indices = data.pass_indices() if data.sampler is not None else None
        if indices is not None:
            return {len(b) for b in indices}
        size = getattr(getattr(data, "loader", None), "batch_size", None)
        return {size} if isinstance(size, int) else set()

    # -- steps -------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _captured(self, wanted: bool) -> Iterator[list[Any]]:
        """The last stage's outputs of the micro-batches run inside the block (a forward hook on its stage).

        A schedule's first step also runs the stage once to infer shapes: only the last ``accumulate_steps``
        outputs are the micro-batches' (:meth:`_batch_outputs`)."""
        captured: list[Any] = []
        hook = None
        if wanted and self.has_outputs:
            hook = self.net.module.register_forward_hook(lambda _m, _a, out: captured.append(out))
        try:
            yield captured
        finally:
            if hook is not None:
                hook.remove()

    def _batch_outputs(self, captured: list[Any]) -> Any:
        return _cat(captured[-int(self.net.accumulate_steps):]) if captured else None

    def train_step(self, batch: Any) -> dict[str, Any]:
        """``train_batch`` with the Trainer's optimizer step; training metrics on the last stage."""
        t = self.trainer
        inputs, labels = t.split_batch(batch)
        with self._captured(bool(t.metrics)) as captured:
            loss = self.net.train_batch([_pack(inputs), _pack(labels)], _TrainerStep(t))
        if captured:
            t.update_metrics(self._batch_outputs(captured), labels)
        return {"loss": loss}

    def _outputs(self, batch: Any) -> tuple[Any, tuple[Any, ...]]:
        """The last stage's outputs for ``batch`` (None on the other stages), padded rows dropped; its labels.

        A forward-only run of the pipeline's one schedule (Note [one schedule per stage]): evaluating or
        predicting between training steps leaves the training as it was.
        """
        inputs, labels = self.trainer.split_batch(batch)
        n = batch_length(batch)
        out = self.net.eval_batch([_pack(_pad(inputs, self.rows)), None], compute_loss=False)
        return (trim_batch(out, n) if self.has_outputs else None), labels

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """Loss and metrics of a (possibly short) batch, on the last stage; ``{}`` on the others."""
        t = self.trainer
        out, labels = self._outputs(batch)
        if out is None:
            return {}
        t.update_metrics(out, labels)
        if t.loss_fn is None or not labels:
            return {}
        return {"loss": t.loss_fn(out, _pack(labels))}  # the PipelineLayer's call: loss_fn(output, labels)

    def predict_step(self, batch: Any) -> Any:
        """The model's outputs for the batch on the last stage, None on the others."""
        return self._outputs(batch)[0]

    # -- results -------------------------------------------------------------------------------------------------
    def share(self, value: Any) -> Any:
        """The last stage's ``value`` on every stage of this pipeline (collective over the pipe group)."""
        holder = [value]
        td.broadcast_object_list(holder, src=self.last_rank, group=self.net.pp_group)
        return holder[0]

    def agree_buffers(self) -> None:
        """Note [agreed buffers]: a stage's buffers are its own, so they are agreed over the stage's data group
        (every rank of it takes its first rank's), never the world."""
        g = data_group()
        if g.size > 1:
            broadcast_coalesced(list(self.net.module.buffers()), g.group)

    def idle_forward(self, batch: Any) -> None:
        """Nothing: a stage's forward alone is not collective, a batch of padding only needs no run."""
