"""The fit, evaluate and predict loops (Keras' epoch loop; the steps themselves live on the Trainer).

# Note [epoch end]
``on_epoch_end`` fires, and evaluation runs, only for an epoch that really
ended (its last batch done). A stop in the middle of an epoch
(``stop_training`` set by a callback at a step boundary, or ``num_iters``
reached) ends training without them, so a per-epoch LR scheduler is not
stepped for a half epoch and a resumed run continues that epoch exactly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from ..checkpoint import LoadedCheckpoint
from ..distributed import collective
from ..distributed.faults import peer_failures
from ..distributed.fleet.gradient_merge import GradientMerge
from ..io.evaluation import trim_batch
from .callbacks import NonFiniteLossError, Preemption
from .data_adapter import DataAdapter, batch_length
from .metrics import reduce_sums

__all__ = ["FitPlan", "run_fit", "run_evaluate", "run_predict", "evaluate_in_epoch", "metric_logs", "sync_buffers"]


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


def _record_train(t, out: dict[str, Any], n: int) -> dict[str, Any]:
    """Add a training batch to the epoch's running sums; the batch hook's logs (Keras: running values).

    The training loss is the optimized one: batch means weighted by batch size, padding repeats included;
    metrics count real samples only (``update_metrics`` trims the padding).
    """
    if not isinstance(out, dict) or "loss" not in out:
        raise TypeError(f"train_step must return a dict with 'loss', got {type(out).__name__}")
    logs = {"loss": t.fit_state.add_batch(out["loss"], n)}
    logs.update(metric_logs(t.metrics, lazy=True))
    logs.update({k: v for k, v in out.items() if k != "loss"})
    logs["batch_size"] = n
    return logs


def _epoch_logs(t, reduce: bool) -> dict[str, Any]:
    extra = t.fit_state.sums()
    if reduce:
        extra = reduce_sums(t.metrics, extra)
    logs = {"loss": float(extra[0] / max(extra[1].item(), 1.0))}
    logs.update(metric_logs(t.metrics))
    return logs


def sync_buffers(t) -> None:
    """Give every rank rank 0's buffers (BatchNorm statistics...), the ones a checkpoint holds (collective).

    Note [agreed buffers]: the data-parallel engine broadcasts buffers before each training forward (as DDP
    does), so after the last step every rank's buffers reflect its own last batch. Evaluation, prediction and
    the end of ``fit`` first take rank 0's, so every rank evaluates the model that is saved.
    """
    t.parallel_network.agree_buffers()


def _start_epoch(t, adapter: DataAdapter, epoch: int):
    """Enter ``epoch`` afresh and return its batch iterator (a resumed epoch's: ``CheckpointConnector.restore``)."""
    adapter.set_epoch(epoch)
    t.fit_state.start_epoch(epoch, t.metrics)
    return iter(adapter)


def run_fit(t, train: DataAdapter, evaluation: DataAdapter | None, plan: FitPlan, callbacks,
            resume: LoadedCheckpoint | None) -> None:
    """The epoch loop; a lost peer rank becomes a ``CollectiveError`` naming it (Note [lost rank diagnosis]).

    The optimizer's gradient-merge window is driven by the loop (Note [gradient merge window]).
    """
    st = t.fit_state
    st.adapter, st.fitting = train, True
    saves = t.checkpoint_connector
    try:
        with peer_failures("training"), t.optimizer.merge.driven(plan.accumulate, t.merge_avg) as merge:
            st.accumulate = merge.k
            try:
                _run_fit(t, train, evaluation, plan, callbacks, resume, merge)
            except NonFiniteLossError:  # raised on every rank at the same step: they commit together
                saves.finish_saves()  # Note [saves in flight]
                raise
            saves.finish_saves()
    except BaseException as e:
        callbacks.on_exception(e)
        saves.abandon_saves(e)
        raise
    finally:
        st.fitting = False
        st.pending_saves.clear()
        for cb in callbacks.find(Preemption):  # signal handlers back even when training failed
            cb.close()


def _run_fit(t, train: DataAdapter, evaluation: DataAdapter | None, plan: FitPlan, callbacks,
             resume: LoadedCheckpoint | None, merge: GradientMerge) -> None:
    st = t.fit_state
    num_iters = plan.num_iters
    t.stop_training = False
    start_epoch, resumed = plan.initial_epoch, None  # Keras' initial_epoch; a resumed run's position wins
    if resume is None:
        callbacks.on_train_begin()
    else:  # everything put back in one method, on_train_begin at its place (Note [resume order])
        start_epoch, resumed, exhausted = t.checkpoint_connector.restore(resume, train, callbacks)
    logs: dict[str, Any] = {}
    for epoch in range(start_epoch, plan.epochs):
        if t.stop_training or (num_iters is not None and st.global_step >= num_iters):
            break
        it = _start_epoch(t, train, epoch) if resumed is None else resumed
        pass_len = 0 if resumed is not None and exhausted else train.length()
        resumed = None
        callbacks.params["steps"] = None if pass_len is None else st.batch_in_epoch + pass_len
        callbacks.on_epoch_begin(epoch)
        t.parallel_network.train()
        st.pass_index = 0
        ended = True
        for batch in it:
            n = batch_length(batch)
            valid = train.num_valid(st.pass_index, batch)
            st.at_step_boundary = merge.begin(last=pass_len is not None and st.pass_index == pass_len - 1,
                                              open_ended=pass_len is None)
            st.batch_valid = n if valid is None else valid
            callbacks.on_train_batch_begin(st.batch_in_epoch)
            out = t.train_step(t.to_device(batch))
            merge.end()
            step_logs = _record_train(t, out, n)
            st.batch_in_epoch += 1
            st.pass_index += 1
            if st.at_step_boundary:
                st.global_step += 1
            callbacks.on_train_batch_end(st.batch_in_epoch - 1, step_logs)
            t.run_pending_saves()
            if evaluation is not None and st.at_step_boundary and plan.eval_steps \
                    and st.global_step % plan.eval_steps == 0:
                evaluate_in_epoch(t, evaluation, callbacks)
            if st.at_step_boundary and (t.stop_training or (num_iters is not None and st.global_step >= num_iters)):
                ended = pass_len is not None and st.pass_index == pass_len
                break
        if merge.micro:  # a loader without len() ended inside a window: sync and apply it
            merge.flush(p for p in t.network.parameters() if p.requires_grad)
            st.at_step_boundary = True
            t.optimizer_step()
            st.global_step += 1
        st.at_step_boundary = True
        if not ended:  # Note [epoch end]
            break
        logs = _epoch_logs(t, reduce=train.sharded)
        if evaluation is not None and t.eval_due(epoch, plan.eval_freq):
            val = run_evaluate(t, evaluation, callbacks)
            logs.update({f"val_{k}": v for k, v in val.items()})
        st.epoch_finished = True
        callbacks.on_epoch_end(epoch, logs)
        t.run_pending_saves()
    st.at_step_boundary = True
    if train.sharded:
        sync_buffers(t)  # Note [agreed buffers]
    callbacks.on_train_end(logs)
    t.run_pending_saves()


def run_evaluate(t, data: DataAdapter, callbacks) -> dict[str, Any]:
    """Loss and metrics over ``data``, every sample counted once across ranks (padding cut off)."""
    with peer_failures("evaluation"):
        return _run_evaluate(t, data, callbacks)


def evaluate_in_epoch(t, evaluation: DataAdapter, callbacks) -> None:
    """An evaluation in the middle of an epoch (Keras-side ``eval_steps``), on copies of the metrics, so the
    epoch's training metrics are not disturbed; recorded in ``t.step_evaluations``."""
    saved = t.metrics
    t.metrics = [copy.deepcopy(m) for m in saved]
    try:
        logs = run_evaluate(t, evaluation, callbacks)
    finally:
        t.metrics = saved
    t.step_evaluations.append({"step": t.global_step, **{f"val_{k}": v for k, v in logs.items()}})


def _idle_forward(t, batch: Any) -> None:
    """A forward whose result is dropped, for a batch of padding only: a sharded (stage 2/3) model's forward is
    collective (it all-gathers parameters), so every rank must run as many as the others."""
    if t.parallel_network.is_sharded:
        t.network(*t.split_batch(t.to_device(batch))[0])


def _run_evaluate(t, data: DataAdapter, callbacks) -> dict[str, Any]:
    reason = data.exact_reason()
    if reason is not None:
        raise ValueError(f"cannot evaluate exactly: {reason}")
    if data.sharded:
        sync_buffers(t)  # Note [agreed buffers]
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
            for i, batch in enumerate(data):
                valid = data.num_valid(i, batch)
                if valid is not None:
                    if valid == 0:
                        _idle_forward(t, batch)
                        continue
                    batch = trim_batch(batch, valid)
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
    if data.sharded:
        extra = reduce_sums(t.metrics, extra)
    logs: dict[str, Any] = {}
    if t.loss_fn is not None:
        logs["loss"] = float(extra[0] / max(extra[1].item(), 1.0))
    logs.update(metric_logs(t.metrics))
    callbacks.on_eval_end(logs)
    return logs


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


def run_predict(t, data: DataAdapter, batch_size: int, stack_outputs: bool, callbacks, writer=None) -> Any:
    """Outputs in dataset order, gathered across ranks, padding removed (each sample once).

    With a :class:`~fleetlite.trainer.predict_writer.PredictionWriter` the batches go to disk as they come
    and the merged files' paths are returned (Note [streamed predictions]).
    """
    with peer_failures("prediction"):
        return _run_predict(t, data, batch_size, stack_outputs, callbacks, writer)


def _run_predict(t, data: DataAdapter, batch_size: int, stack_outputs: bool, callbacks, writer=None) -> Any:
    gather = data.sharded and collective.get_world_size() > 1
    indices = data.pass_indices() if gather else None
    if gather and indices is None:
        raise ValueError("cannot gather predictions in dataset order: the data is split across ranks by a sampler "
                         "whose indices are unknown; use a Dataset, a DataLoader over a DistributedBatchSampler, "
                         "or a TensorLoader")
    if data.sharded:
        sync_buffers(t)  # Note [agreed buffers]
    module = t.network
    was_training = module.training
    module.eval()
    local: list[list[torch.Tensor]] = []
    local_idx: list[list[int]] = []  # the dataset indices of each local batch
    writes = writer is not None and (gather or collective.get_rank() == 0)  # unsharded data: rank 0 writes
    if writer is not None:
        writer.start()
    callbacks.on_predict_begin()
    try:
        with torch.no_grad():
            for i, batch in enumerate(data):
                valid = data.num_valid(i, batch)
                if valid is not None:
                    if valid == 0:
                        _idle_forward(t, batch)
                        continue
                    batch = trim_batch(batch, valid)
                callbacks.on_predict_batch_begin(i)
                outs = _as_outputs(_cpu(t.predict_step(t.to_device(batch))))
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
        parts = collective.all_gather_object((local_idx, local))
        local_idx = [ix for p in parts for ix in p[0]]
        local = [b for p in parts for b in p[1]]
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
