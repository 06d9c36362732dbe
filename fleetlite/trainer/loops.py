"""The evaluation and prediction loops, and what the loops share (the fit loop: :mod:`~.fit_loop`).

# Note [agreed buffers]
The data-parallel engine broadcasts buffers before each training forward (as DDP does), so after the last step
every rank's buffers reflect its own last batch. Evaluation, prediction and the end of ``fit`` first take rank
0's (``WrappedModel.agree_buffers``), so every rank evaluates the model that is saved (a pipeline stage: its
data group's first rank's: the step runner's ``agree_buffers``, Note [step runners]).

Sums (loss, metric states) are reduced and predictions gathered over the data group (Note [data group] in
:mod:`fleetlite.distributed.fleet.data_group`); on a pipeline the last stage computes the logs and
predictions and sends them to the other stages: the step runner's ``has_outputs`` and ``share`` (Note [step
runners] in :mod:`~fleetlite.trainer.steps`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..distributed import collective
from ..distributed.faults import peer_failures
from ..distributed.fleet import get_hybrid_communicate_group
from ..distributed.fleet.data_group import data_group
from ..io.evaluation import trim_batch
from .data_adapter import DataAdapter, batch_length
from .metrics import reduce_sums

__all__ = ["FitPlan", "EvaluationLoop", "PredictionLoop", "metric_logs", "pass_logs"]


@dataclass(frozen=True)
class FitPlan:
    """The loop settings of one ``fit`` call (validated by :mod:`~fleetlite.trainer.fit_setup`)."""

    epochs: int
    eval_freq: int = 1
    num_iters: int | None = None  # cap on the total optimizer steps
    initial_epoch: int = 0  # Keras' initial_epoch
    eval_steps: int | None = None  # also evaluate every n optimizer steps (keras_fit)
    accumulate: int | None = None  # micro-batches per step; None: the strategy's gradient_merge k_steps


def metric_logs(metrics, lazy: bool = False) -> dict[str, Any]:
    """``{name: value}`` of every metric; ``lazy`` allows device tensors (no sync; per-batch logs)."""
    logs: dict[str, Any] = {}
    for m in metrics:
        values = m.accumulate_tensor() if lazy else m.accumulate()
        if isinstance(values, torch.Tensor):
            values = list(values.unbind()) if values.dim() else [values]
        values = values if isinstance(values, (list, tuple)) else [values]
        logs.update(zip(m.names(), values))
    return logs


def pass_logs(trainer, extra: torch.Tensor, sharded: bool, with_loss: bool) -> dict[str, Any]:
    """The logs of a pass: ``extra`` (``[loss_sum, count]``) and the metric states summed over the data group
    when ``sharded``; on a pipeline computed by the last stage and sent to the others (the other stages hold
    no outputs), so every rank returns the same dict.

    Example::

        logs = pass_logs(trainer, torch.tensor([12.5, 25.0], dtype=torch.float64), sharded=True, with_loss=True)
    """
    steps = trainer.steps
    logs: dict[str, Any] = {}
    if steps.has_outputs:
        if sharded:
            extra = reduce_sums(trainer.metrics, extra)
        if with_loss:
            logs["loss"] = float(extra[0] / max(extra[1].item(), 1.0))
        logs.update(metric_logs(trainer.metrics))
    return steps.share(logs)


class _InferenceLoop:
    """What the evaluation and prediction loops share: the Trainer they run and the padding-only batch."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def _real_batches(self, data: DataAdapter) -> Iterator[tuple[int, Any]]:
        """``(index, batch)`` of ``data`` with the sampler's padding cut off; a batch of padding only is not
        yielded but still run forward when the model is sharded (:meth:`_idle_forward`)."""
        for i, batch in enumerate(data):
            valid = data.num_valid(i, batch)
            if valid is not None:
                if valid == 0:
                    self._idle_forward(batch)
                    continue
                batch = trim_batch(batch, valid)
            yield i, batch

    def _idle_forward(self, batch: Any) -> None:
        """The step runner's forward of a batch of padding only, where a forward is collective (Note [step
        runners]: a sharded stage 2/3 model's all-gathers parameters; a pipeline stage's alone is not)."""
        self.trainer.steps.idle_forward(batch)


class EvaluationLoop(_InferenceLoop):
    """Loss and metrics over ``data``, every sample counted once across ranks (padding cut off).

    ``metrics``: other metric objects to fill than the Trainer's (a mid-epoch evaluation leaves the epoch's
    training metrics alone).

    Example::

        logs = EvaluationLoop(trainer).run(adapter, callbacks)
    """

    def __init__(self, trainer, metrics: list | None = None) -> None:
        super().__init__(trainer)
        self.metrics = metrics

    def run(self, data: DataAdapter, callbacks) -> dict[str, Any]:
        with peer_failures("evaluation"):
            if self.metrics is None:
                return self._run(data, callbacks)
            with self.trainer.metrics_in_use(self.metrics):
                return self._run(data, callbacks)

    def _run(self, data: DataAdapter, callbacks) -> dict[str, Any]:
        t = self.trainer
        reason = data.exact_reason()
        if reason is not None:
            raise ValueError(f"cannot evaluate exactly: {reason}")
        if data.sharded:
            t.steps.agree_buffers()  # Note [agreed buffers]
        module = t.network
        was_training = module.training
        module.eval()
        for m in t.metrics:
            m.reset()
        loss_sum = torch.zeros((), dtype=torch.float64)
        count = 0
        callbacks.on_eval_begin()
        try:
            with torch.no_grad():
                for i, batch in self._real_batches(data):
                    n = batch_length(batch)
                    callbacks.on_eval_batch_begin(i)
                    t.fit_state.batch_valid = n
                    out = t.eval_step(t.to_device(batch)) or {}
                    loss = out.get("loss")
                    if loss is not None:
                        weight = 1 if getattr(t.loss_fn, "reduction", "mean") == "sum" else n
                        loss_sum = loss_sum.to(loss.device) + loss.detach().to(torch.float64) * weight
                    count += n
                    callbacks.on_eval_batch_end(i, {"loss": loss, "batch_size": n})
        finally:
            module.train(was_training)
        extra = torch.stack([loss_sum.cpu(), torch.tensor(float(count), dtype=torch.float64)])
        logs = pass_logs(t, extra, data.sharded, t.loss_fn is not None)
        callbacks.on_eval_end(logs)
        return logs


def _holds_outputs(trainer) -> bool:
    """Whether this rank's predictions are its model replica's to write: the last pipeline stage, the first
    rank of a tensor-parallel group (the others hold the same outputs)."""
    if not trainer.steps.has_outputs:
        return False
    return not data_group().hybrid or get_hybrid_communicate_group().get_model_parallel_rank() == 0


def _cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return [_cpu(v) for v in x]
    if isinstance(x, dict):
        return {k: _cpu(v) for k, v in x.items()}
    raise TypeError(f"predict_step must return tensors (or a tuple/list/dict of them), got {type(x).__name__}")


def _as_outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)) and all(isinstance(o, torch.Tensor) for o in out):
        return list(out)
    raise TypeError(f"predict_step must return a tensor or a tuple of tensors, got {type(out).__name__}")


class PredictionLoop(_InferenceLoop):
    """Model outputs over ``data`` in dataset order, gathered across ranks, padding removed (each sample once).

    With a :class:`~fleetlite.trainer.predict_writer.PredictionWriter` the batches go to disk as they come
    and the merged files' paths are returned (Note [streamed predictions]).

    Example::

        outputs = PredictionLoop(trainer).run(adapter, 32, False, callbacks)
    """

    def run(self, data: DataAdapter, batch_size: int, stack_outputs: bool, callbacks, writer=None) -> Any:
        with peer_failures("prediction"):
            return self._run(data, batch_size, stack_outputs, callbacks, writer)

    def _run(self, data: DataAdapter, batch_size: int, stack_outputs: bool, callbacks, writer=None) -> Any:
        t = self.trainer
        gather = data.sharded  # over the data group (Note [data group])
        indices = data.pass_indices() if gather else None
        if gather and indices is None:
            raise ValueError("cannot gather predictions in dataset order: the data is split across ranks by a sampler "
                             "whose indices are unknown; use a Dataset, a DataLoader over a DistributedBatchSampler, "
                             "or a TensorLoader")
        if data.sharded:
            t.steps.agree_buffers()  # Note [agreed buffers]
        module = t.network
        was_training = module.training
        module.eval()
        local: list[list[torch.Tensor]] = []
        local_idx: list[list[int]] = []  # the dataset indices of each local batch
        group = data_group()
        # one writer per model replica: the last stage's first tensor-parallel rank; unsharded data: replica 0's
        writes = writer is not None and _holds_outputs(t) and (gather or group.rank == 0)
        if writer is not None:
            writer.start()
        callbacks.on_predict_begin()
        try:
            with torch.no_grad():
                for i, batch in self._real_batches(data):
                    callbacks.on_predict_batch_begin(i)
                    out = t.predict_step(t.to_device(batch))
                    if not t.steps.has_outputs:  # a pipeline stage before the last: no outputs here
                        callbacks.on_predict_batch_end(i, {"outputs": None})
                        continue
                    outs = _as_outputs(_cpu(out))
                    idx = list(indices[i][:batch_length(batch)]) if indices is not None else None
                    if writes:
                        writer.write(outs, idx)
                    elif writer is None:
                        local.append(outs)
                        if idx is not None:
                            local_idx.append(idx)
                    callbacks.on_predict_batch_end(i, {"outputs": outs})
        finally:
            module.train(was_training)
        if writer is not None:
            paths = writer.finish()
            callbacks.on_predict_end({"num_samples": writer.rows, "paths": paths})
            return paths
        if gather:
            parts = collective.all_gather_object((local_idx, local), group=group.group)
            local_idx = [ix for p in parts for ix in p[0]]
            local = [b for p in parts for b in p[1]]
        local_idx, local = t.steps.share((local_idx, local))  # a pipeline's last stage's, on every stage
        result = _assemble(local, local_idx if gather else None, batch_size, stack_outputs)
        callbacks.on_predict_end({"num_samples": int(result[0].shape[0]) if stack_outputs and result else
                                  sum(int(b[0].shape[0]) for b in local)})
        return result[0] if len(result) == 1 else result


def _assemble(batches: list[list[torch.Tensor]], idx: list[list[int]] | None, batch_size: int,
              stack_outputs: bool) -> list[Any]:
    """Per output, the batches (or one stacked tensor) in dataset order; ``idx``: each batch's dataset indices.

    # Note [predict batches]
    Equal non-batch dims: the outputs are concatenated in dataset order and cut into ``batch_size`` chunks
    (on one rank these are exactly the computed batches; across ranks, Paddle's layout). Differing dims
    (variable-length sequences, detection heads) cannot be regrouped: each batch comes back as computed,
    the batches ordered by their first sample's dataset index.
    """
    n_out = max((len(b) for b in batches), default=0)
    if idx is not None:
        order = sorted(range(len(batches)), key=lambda j: idx[j][0] if idx[j] else -1)
        batches, idx = [batches[j] for j in order], [idx[j] for j in order]
    result = []
    for k in range(n_out):
        col = [b[k] for b in batches if len(b) > k]
        same = len({tuple(c.shape[1:]) for c in col}) <= 1
        if not stack_outputs and not same:
            result.append(col)
            continue
        if not same:
            raise ValueError(f"predict(stack_outputs=True): output {k} has different non-batch shapes across "
                             f"batches ({sorted({tuple(c.shape[1:]) for c in col})}), so it cannot be stacked "
                             "into one tensor; use stack_outputs=False to get the batches as computed")
        cat = torch.cat(col) if col else torch.empty(0)
        if idx is not None:
            flat = torch.tensor([j for ix in idx for j in ix], dtype=torch.int64)
            cat = cat[torch.argsort(flat, stable=True)]
        result.append(cat if stack_outputs else list(torch.split(cat, batch_size)))
    return result
