"""Paddle's ``PipelineParallel`` on ``torch.distributed.pipelining``: ``train_batch`` and ``eval_batch``.

One :class:`~torch.distributed.pipelining.PipelineStage` per model chunk
(the :class:`~.layers.PipelineLayer` itself, or each of its interleaved
chunks), driven by the schedule of Note [pipeline schedules]. A batch is cut
into ``accumulate_steps`` micro-batches of ``micro_batch_size`` rows
(``strategy.pipeline_configs``) by us, so inputs and labels may be tensors or
tuples of tensors (Paddle allows ``[(x1, x2), (y,)]``; torch's schedules
split only tensors), or already micro-batches: a list of ``accumulate_steps``
entries (Paddle's list form). The loss functions get each micro-batch's
labels in the structure the user gave (Note [label micro-batches]).

Note [pipeline schedules]
``schedule_mode`` (Paddle's names) picks torch's schedule once, at
construction: one chunk per stage runs ``Schedule1F1B`` ("1F1B", the
default) or ``ScheduleGPipe`` ("FThenB"/"F-then-B"); with fewer
micro-batches than stages (``accumulate_steps=1`` on pp2, which Paddle's 1F1B
runs as all forwards then all backwards) "1F1B" runs ``ScheduleGPipe``, which
computes the same gradients. Interleaved chunks
(``num_virtual_pipeline_stages > 1``) run ``ScheduleInterleaved1F1B``
("1F1B" or "VPP") or ``ScheduleLoopedBFS`` ("FThenB").

Note [pipeline gradients]: the gradients are divided by the number of
micro-batches after the schedule (Paddle divides each micro-batch's loss by
``accumulate_steps``: the same mean; by us, not by torch's stages, which
would divide a layer shared by two chunks of one rank twice). Then shared weights'
gradients are summed over the stages that share them, then every gradient is
averaged over the data-parallel group (under sharding stage 3 FSDP2 has
reduce-scattered them: Note [stage 3 beside pp]), then the optimizer steps. The
returned loss is the mean over micro-batches, broadcast from the last stage
to every stage of the pipeline (as Paddle's ``_broadcast_final_loss``).

Example (2 ranks; ``model`` a ``PipelineLayer`` with ``num_stages=2``)::

    pp = PipelineParallel(model, strategy=strategy)
    loss = pp.train_batch([x, y], optimizer)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as td
from torch import nn

from .....parallel.wrapped import WrappedModel
from ..hybrid_sharding import ShardedGradients, wants_sharded_gradients
from .boundary import BoundaryStage as PipelineStage  # Note [pipeline boundaries]
from .boundary import link_stages
from .layers import PipelineLayer
from .schedules import schedule_class as _schedule_class
from .schedules import split_micro_batches as _split

__all__ = ["PipelineParallel"]

def _group_ranks(group: Any) -> list[int]:
    return td.get_process_group_ranks(group) if group is not None else list(range(td.get_world_size()))


class PipelineParallel(WrappedModel):
    """Paddle's ``PipelineParallel``: what ``fleet.distributed_model`` returns for a :class:`PipelineLayer`.

    ``hcg``: a ``HybridCommunicateGroup`` (its pipe and data groups are used);
    ``None`` lays the ranks out as the layer's topology or Paddle's default
    (Note [pipeline rank layout]). ``strategy``: a ``DistributedStrategy``
    (``pipeline_configs``: ``accumulate_steps``, ``micro_batch_size``,
    ``schedule_mode`` "1F1B", "FThenB"/"F-then-B" or "VPP": Note [pipeline
    schedules]), or pass ``accumulate_steps`` / ``micro_batch_size`` /
    ``schedule`` directly.
    """

    step_runner = "pipeline"  # the Trainer's steps run through train_batch / eval_batch (Note [step runners])

    def __init__(self, layers: PipelineLayer, hcg: Any = None, strategy: Any = None, *,
                 accumulate_steps: int | None = None, micro_batch_size: int | None = None,
                 schedule: str | None = None) -> None:
        super().__init__()
        if not isinstance(layers, PipelineLayer):
            raise TypeError(f"PipelineParallel needs a PipelineLayer, got {type(layers).__name__}; describe the "
                            "model as PipelineLayer([LayerDesc(...), ...], num_stages=...)")
        if not td.is_initialized():
            raise RuntimeError("PipelineParallel needs a process group; call fleet.init(is_collective=True, "
                               "strategy=...) first")
        cfg = dict(strategy.pipeline_configs) if strategy is not None else {}
        self.accumulate_steps = int(accumulate_steps or cfg.get("accumulate_steps", 1))
        self.micro_batch_size = int(micro_batch_size or cfg.get("micro_batch_size", 1))
        mode = schedule or cfg.get("schedule_mode", None) or "1F1B"
        schedule_class = _schedule_class(mode, self.accumulate_steps, layers.get_num_stages(),
                                         layers.get_num_virtual_stages())
        self.schedule_mode = mode
        self._layers = layers
        self._hcg = hcg
        self.num_stages = layers.get_num_stages()
        self.stage_id = layers.get_stage_id()
        self.is_pipeline_first_stage = self.stage_id == 0
        self.is_pipeline_last_stage = self.stage_id == self.num_stages - 1
        self.pp_group, self.dp_group = self._groups(hcg, layers)
        self._last_rank = _group_ranks(self.pp_group)[-1]
        device = next((p.device for p in layers.parameters()), torch.device("cpu"))
        chunks = layers.get_model_chunks()
        #: sharding stage 3: this stage sharded by FSDP2 over dp × sharding (Note [stage 3 beside pp])
        self.stage3 = self._shard_stage3(layers, hcg, strategy, chunks)
        if chunks is None:
            self._stages = [PipelineStage(layers, self.stage_id, self.num_stages, device, group=self.pp_group)]
        else:  # chunk i of this rank is stage stage_id + i * pp of pp * v (Note [virtual pipeline stages])
            total = self.num_stages * len(chunks)
            self._stages = [PipelineStage(c, self.stage_id + i * self.num_stages, total, device, group=self.pp_group)
                            for i, c in enumerate(chunks)]
        link_stages(self._stages)
        self._stage = self._stages[0]
        # Note [one schedule per stage]; gradients divided by us (Note [pipeline gradients])
        self._schedule_obj = self._make_schedule(schedule_class)
        self._broadcast_dp_replicas()
        #: sharding stage 2: gradients reduced to their owners, freed elsewhere (Note [hybrid sharding stage 2])
        self.sharded_grads = ShardedGradients(layers.parameters(), hcg) if wants_sharded_gradients(hcg, strategy) \
            else None
        self._label_mbs: list[Any] | None = []
        self._mb_losses: dict[int, torch.Tensor] = {}  # unscaled, by micro-batch: one value per loss function
        self.loss_fn_idx = 0  # Paddle's: the loss function train_batch differentiates
        self._scaler: Any = None  # the GradScaler of the train_batch in progress

    @staticmethod
    def _groups(hcg: Any, layers: PipelineLayer) -> tuple[Any, Any]:
        """(pipe group, data group or None); without hcg every rank creates every group (collective)."""
        if hcg is not None:
            if hcg.get_stage_id() != layers.get_stage_id() or hcg.get_pipe_parallel_world_size() != \
                    layers.get_num_stages():
                raise ValueError(f"this rank is stage {hcg.get_stage_id()} of {hcg.get_pipe_parallel_world_size()} in "
                                 f"the hybrid topology but stage {layers.get_stage_id()} of {layers.get_num_stages()} "
                                 "in the PipelineLayer; build it with PipelineLayer(..., topology=hcg.topology())")
            # the ranks that hold this stage and read other data: dp × sharding (Note [sharding with mp and pp])
            dp = hcg.get_data_sharding_parallel_group() if hcg.get_data_sharding_parallel_world_size() > 1 else None
            return hcg.get_pipe_parallel_group(), dp
        pipelines, rank = layers._layout.pipelines, td.get_rank()
        pp_group = dp_group = None
        for ranks in pipelines:
            group = td.new_group(ranks=ranks)
            if rank in ranks:
                pp_group = group
        for s in range(layers.get_num_stages()):
            ranks = [p[s] for p in pipelines]
            group = td.new_group(ranks=ranks)
            if rank in ranks and len(ranks) > 1:
                dp_group = group
        return pp_group, dp_group

    @staticmethod
    def _shard_stage3(layers: PipelineLayer, hcg: Any, strategy: Any, chunks: Any) -> bool:
        """Sharding stage 3: ``fully_shard`` the stage over dp × sharding (Note [stage 3 beside pp])."""
        from ..hybrid_stage3 import shard_pipeline_stage, wants_stage3_pipeline

        if not wants_stage3_pipeline(hcg, strategy):
            return False
        if chunks is not None or layers.shared_comm:
            raise NotImplementedError("sharding stage 3 beside pp_degree > 1 shards one stage per rank without "
                                      "shared layers; drop num_virtual_pipeline_stages / SharedLayerDesc, or use "
                                      "sharding_configs['stage'] = 2")
        shard_pipeline_stage(layers, hcg)
        return True

    @torch.no_grad()
    def _broadcast_dp_replicas(self) -> None:
        """Data-parallel replicas of a stage start from the same weights (those of the group's first rank)."""
        if self.dp_group is None or self.stage3:  # stage 3: broadcast before sharding
            return
        src = min(_group_ranks(self.dp_group))
        for t in [*self._layers.parameters(), *self._layers.buffers()]:
            td.broadcast(t, src=src, group=self.dp_group)

    # Note [one schedule per stage]
    # A torch schedule remembers whether it has set its stage up for forward only or for backward too
    # (``_stage_forward_initialized`` / ``_stage_backward_initialized``) and sets the stage up again when that
    # changes (its eval <-> train switch); the stage itself is shared. Two schedules over one stage (one with a
    # loss for training, one without for evaluation) each believe the stage is still set up as they left it. So
    # there is ONE schedule, with the loss function: training runs ``step``, every evaluation ``eval`` (forward
    # only), and an evaluation without labels gets a zero loss per micro-batch that nothing reads.
    def _make_schedule(self, schedule_class: type) -> Any:
        n = self.accumulate_steps
        stages = self._stages if len(self._stages) > 1 else self._stages[0]
        try:
            return schedule_class(stages, n, loss_fn=self._micro_loss, scale_grads=False)
        except ValueError as e:  # torch's own condition (e.g. the interleaved rounds), said once, with the fix
            raise ValueError(f"accumulate_steps={n} does not fit the {self.schedule_mode} schedule over "
                             f"{self.num_stages} stages ({' '.join(str(e).split())}); change accumulate_steps "
                             "(e.g. a multiple of the pp degree)") from None

    def _loss_fns(self) -> list[Any]:
        fn = self._layers._loss_fn
        return list(fn) if isinstance(fn, (list, tuple)) else [fn]

    def _micro_loss(self, output: Any, index: torch.Tensor) -> torch.Tensor:
        """Every loss function on micro-batch ``index`` (Note [label micro-batches]), recorded; the one at
        ``loss_fn_idx`` is differentiated (Paddle's). A zero nothing reads in an evaluation without labels
        (Note [one schedule per stage])."""
        if self._label_mbs is None:
            return torch.zeros((), device=self._stage.device)
        labels = self._label_mbs[int(index)]
        losses = [fn(output, labels) for fn in self._loss_fns()]
        self._mb_losses[int(index)] = torch.stack([v.detach().float().reshape(()) for v in losses])
        loss = losses[self.loss_fn_idx]
        return self._scaler.scale(loss) if self._scaler is not None else loss

    @property
    def module(self) -> nn.Module:
        """This rank's stage, the :class:`PipelineLayer` (the ``WrappedModel`` protocol's plain model)."""
        return self._layers

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """This stage's layers alone (no pipeline): use :meth:`train_batch` / :meth:`eval_batch` to run the model."""
        return self._layers(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """This stage's ``PipelineLayer`` state (keys by global layer index, as Paddle's wrapper returns)."""
        return self._layers.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self._layers.load_state_dict(state_dict, strict=strict, assign=assign)

    def _run(self, data: Sequence[Any], train: bool, compute_loss: bool) -> tuple[torch.Tensor | None, Any]:
        """Run the schedule; the loss table ``(loss functions, micro-batches)`` on every stage, and the output."""
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise ValueError("train_batch/eval_batch take data=[inputs, labels] (inputs and labels each a tensor "
                             "or a tuple of tensors)")
        inputs, labels = data
        if compute_loss and self._layers._loss_fn is None:
            raise ValueError("the PipelineLayer has no loss_fn; give PipelineLayer(..., loss_fn=...) to train or "
                             "to evaluate with compute_loss=True")
        n, size = self.accumulate_steps, self.micro_batch_size
        # every stage checks the batch (all get [inputs, labels]): a bad size fails everywhere, never a hang
        input_mbs = _split(inputs, n, size, "input")
        label_mbs = _split(labels, n, size, "label") if compute_loss else []
        # every stage gets the micro-batches, as in Paddle; torch's schedule gives them to the stage whose place
        # uses them (the inputs to the first stage, the targets to the last); as tensors: Note [pipeline boundaries]
        kw: dict[str, Any] = {"arg_mbs": self._stage.flatten_inputs(input_mbs)}
        self._mb_losses = {}
        # Note [label micro-batches]: torch's schedules take tensor targets only; the schedule gets each
        # micro-batch's index and _micro_loss looks its labels up, in the structure the user gave
        self._label_mbs = label_mbs if compute_loss else None
        kw["target_mbs"] = [torch.tensor(i) for i in range(n)]
        schedule = self._schedule_obj
        out = schedule.step(**kw) if train else schedule.eval(**kw)
        if train:
            self._scale_gradients()
        if not compute_loss:
            return None, out
        table = torch.stack([self._mb_losses[i] for i in range(n)], dim=1) if self._mb_losses else None
        return self._broadcast_final_loss(table), out

    @torch.no_grad()
    def _scale_gradients(self) -> None:
        """Note [pipeline gradients]: the mean over micro-batches, each parameter once."""
        if self.accumulate_steps > 1:
            for p in self._layers.parameters():
                if p.grad is not None:
                    p.grad.div_(self.accumulate_steps)

    def _broadcast_final_loss(self, table: torch.Tensor | None) -> torch.Tensor:
        """The last stage's loss table, ``(loss functions, micro-batches)`` float32, on every stage of the pipe."""
        if table is None:
            table = torch.zeros((len(self._loss_fns()), self.accumulate_steps), device=self._stage.device)
        td.broadcast(table, src=self._last_rank, group=self.pp_group)
        return table

    def _losses(self, table: torch.Tensor, micro: bool) -> Any:
        """Paddle's return: per loss function the mean over micro-batches, or (``micro``) each micro-batch's loss
        divided by ``accumulate_steps`` (Paddle scales them so; they sum to the mean); one alone, else a list."""
        per = (table / self.accumulate_steps if self.accumulate_steps > 1 else table) if micro else table.mean(dim=1)
        return per[0] if per.shape[0] == 1 else list(per)

    def _use_loss_fn(self, loss_fn_idx: int) -> None:
        fns = self._loss_fns()
        if not (isinstance(loss_fn_idx, int) and 0 <= loss_fn_idx < len(fns) and fns[loss_fn_idx] is not None):
            raise ValueError(f"loss_fn_idx={loss_fn_idx!r} names no loss function: the PipelineLayer has "
                             f"{len(fns)} (loss_fn=[...]); give an index below {len(fns)}")
        self.loss_fn_idx = loss_fn_idx

    @torch.no_grad()
    def _reduce_gradients(self) -> None:
        """Note [pipeline gradients]: shared weights summed over their stages, then averaged over data parallel
        (dp × sharding: Note [sharding with mp and pp]); with sharding stage 2 on the owners in the optimizer's
        partition only, freed elsewhere (Note [hybrid sharding stage 2])."""
        self._layers.allreduce_shared_weight_gradients()
        if self.sharded_grads is not None:
            self.sharded_grads.reduce()
            return
        if self.dp_group is not None and not self.stage3:  # Note [one gradient rule]; stage 3: FSDP2 reduced
            from ...gradients import average_gradients

            average_gradients([p for p in self._layers.parameters() if p.requires_grad], self.dp_group)

    def train_batch(self, data: Sequence[Any], optimizer: torch.optim.Optimizer, lr_scheduler: Any = None,
                    scaler: Any = None, loss_fn_idx: int = 0, return_micro_batch_loss: bool = False) -> Any:
        """One optimizer step over ``accumulate_steps`` micro-batches of ``data = [inputs, labels]``.

        Returns the mean loss over the micro-batches, the same tensor on every stage; with several loss
        functions (``PipelineLayer(loss_fn=[...])``) a list, one per function, of which ``loss_fn_idx`` is the
        one trained; ``return_micro_batch_loss=True``: each micro-batch's loss instead (Paddle's: divided by
        ``accumulate_steps``). ``optimizer._grad_clip``
        (Paddle's ``grad_clip=``) is applied once, after the gradient reductions, the global norm across all
        stages: by a ``fleet.distributed_optimizer`` in its step, else here (Note [who clips]).
        With ``scaler`` (``fleet.distributed_scaler(GradScaler(...))``: its skip decision agrees on every rank),
        the last stage scales each micro-batch's loss and every stage steps through ``scaler.step`` /
        ``scaler.update``. Under strategy ``amp`` with float16 a ``fleet.distributed_optimizer`` brings its own
        scaler (pass none): Note [pipeline strategies].
        """
        if self._layers._loss_fn is not None:
            self._use_loss_fn(loss_fn_idx)
        scaler, amp = self._check_scaler(scaler, optimizer)
        self.train()
        if scaler is not None:
            # stages that never see the loss never call scale(): create the lazily made scale on every stage
            (amp or scaler).scale(torch.ones((), device=self._stage.device))
        self._scaler = scaler
        try:
            table, _ = self._run(data, train=True, compute_loss=True)
        finally:
            self._scaler = None
        self._reduce_gradients()
        from ...gradients import GradGroups
        from ..hybrid_clip import step_clipper

        # Note [who clips]: a fleet.distributed_optimizer clips in its own step; a plain optimizer's _grad_clip here
        clip = step_clipper(optimizer, hcg=self._hcg, groups=GradGroups(pipe=self.pp_group))
        if clip is not None:
            if scaler is not None and amp is None:
                scaler.unscale_(optimizer)
            clip(self._layers.parameters())
        if scaler is not None and amp is None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad()
        if lr_scheduler is not None:
            lr_scheduler.step()
        return self._losses(table, return_micro_batch_loss)

    def _check_scaler(self, scaler: Any, optimizer: Any) -> tuple[Any, Any]:
        """(the scaler of this batch, the optimizer's AmpHelper when it scales and steps itself, else None).

        A ``fleet.distributed_optimizer`` under strategy ``amp`` with float16 owns a scaler (Note [pipeline
        strategies]): the losses are scaled with it and its ``step`` unscales, skips and updates.
        """
        amp = getattr(optimizer, "amp", None)
        own = amp if getattr(amp, "uses_scaler", False) else None
        if scaler is None or not scaler.is_enabled():
            return (own.scaler, own) if own is not None else (None, None)
        if own is not None:
            raise ValueError("train_batch got a scaler, but the optimizer comes from fleet.distributed_optimizer "
                             "under strategy.amp with float16 and scales the loss itself; drop scaler= (or turn "
                             "strategy.amp off and keep fleet.distributed_scaler(...))")
        from ...amp import DistGradScaler

        if not isinstance(scaler, DistGradScaler) and td.get_world_size() > 1:
            raise TypeError(f"train_batch got a {type(scaler).__name__}, whose inf/nan skip would differ between "
                            "stages; pass fleet.distributed_scaler(scaler)")
        return scaler, None

    @torch.no_grad()
    def eval_batch(self, data: Sequence[Any], compute_loss: bool = False, loss_fn_idx: int = 0) -> Any:
        """Forward only. ``compute_loss=True``: the mean loss on every stage (a list with several loss
        functions); else the last stage's outputs (the micro-batches' outputs concatenated; ``None`` on other
        stages)."""
        if compute_loss and self._layers._loss_fn is not None:
            self._use_loss_fn(loss_fn_idx)
        self.eval()
        table, out = self._run(data, train=False, compute_loss=compute_loss)
        return self._losses(table, False) if compute_loss else out

    @property
    def last_stage_rank(self) -> int:
        """The global rank of this pipeline's last stage (the one that computes the loss and the outputs)."""
        return self._last_rank

    # -- the WrappedModel protocol's full weights (Note [hybrid full state]) --------------------------------------
    @property
    def is_sharded(self) -> bool:
        """True with more than one stage: the full weights are gathered from every stage (collective)."""
        return self.num_stages > 1

    def full_state_dict(self, rank0_only: bool = False) -> dict[str, torch.Tensor]:
        """The state of ``PipelineLayer(the same descs, num_stages=1)``: every stage's entries (mp slices
        gathered), collective over the pipeline (and mp) group."""
        from ..hybrid_state import full_state_dict

        return full_state_dict(self._layers, rank0_only=rank0_only, pp_group=self.pp_group)

    def load_full_state_dict(self, state_dict: Any, strict: bool = True) -> Any:
        """Load a single-process (one-stage) state: this rank keeps its stage's entries (its mp slices of them)."""
        from ..hybrid_state import load_full_state_dict

        return load_full_state_dict(self._layers, state_dict, strict=strict)

    def state_layout(self) -> Any:
        """How this rank's state sits in the full model's (the ``WrappedModel`` protocol; Note [hybrid full state])."""
        from ..hybrid_state import state_layout

        return state_layout(self._layers)

    def agree_buffers(self) -> None:
        """Give this stage's data-parallel replicas the first replica's buffers (collective over the data-parallel
        group; each stage holds its own buffers, so never over the world)."""
        if self.dp_group is not None:
            from .....parallel.comm import broadcast_coalesced

            broadcast_coalesced(list(self._layers.buffers()), self.dp_group)
