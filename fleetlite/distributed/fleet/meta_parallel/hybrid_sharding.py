"""Sharding stage 2 next to tensor and pipeline parallelism: each rank keeps only the gradients it updates.

# Note [hybrid sharding stage 2]
Paddle's ``GroupShardedStage2`` semantics on ``hybrid_configs``' sharding axis: the optimizer state is
partitioned over the sharding group as in stage 1 (``ZeroRedundancyOptimizer``: Note [sharding with mp and pp])
*and* so are the gradients: after the reduction a rank holds the gradients of the parameters its ZeRO
partition owns, the others are freed (``p.grad = None``), so the gradient memory held from the reduction
through clipping and the optimizer step falls by about the sharding degree.

The reduction is a *reduce to the owner*, half the traffic of an all-reduce: at the end of a synced backward
(``TensorParallel`` under mp, ``PipelineParallel._reduce_gradients`` under pp) the gradients owned by
sharding rank ``r``, flattened per dtype and divided by dp × sharding first (Note [divide before sum]), are
``reduce``d to ``r`` inside the sharding group, for ``r = 0, 1, ...`` in that order on every rank; with
``dp_degree`` > 1 each owner then all-reduces its part over the dp group (the owners of the same parameters
in the other replicas). A non-owner frees a part as soon as it was sent. Fleetlite's bucketed engine is not
used for these models (its flat buckets would keep every gradient alive): gradients are autograd's own
tensors until the reduction, so a backward still holds the full set for a moment, as in Paddle when
``p.grad`` is accumulated before its reduce. Under ``no_sync`` / gradient merge the window's backwards keep
full local gradients and its last backward reduces the accumulated sum; a parameter that got no gradient on
this rank takes part as zeros (the owner steps with a zero gradient, as a pipeline stage does).

Which rank owns a parameter is the ZeroRedundancyOptimizer's partition (``_param_to_rank``, read at each
reduction): ``fleet.distributed_optimizer`` marks its parameters with it (``sharded_grad_partition``), so the
model finds it whatever optimizer object a loop passes around (the Trainer's pipeline step passes its own); a
synced backward before that, or a trainable parameter in no such optimizer, is refused with one line. The
global norm for clipping (Note [hybrid global norm]) adds the owners' squared sums over the sharding group as
well: each parameter is counted once across dp, sharding, mp and pp; the parameters carry the group
(``sharded_grad_group``) so the Trainer's clipping finds it without knowing the strategy. A parameter is owned
whole (ZeRO's partition), so the gradient bytes per rank are 1/sharding of the model's at that granularity.

Example::

    strategy.hybrid_configs = {"mp_degree": 2, "sharding_degree": 2}
    strategy.sharding_configs = {"stage": 2}
    fleet.init(is_collective=True, strategy=strategy)
    model = fleet.distributed_model(MLP())            # TensorParallel with sharded gradients
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters()))
    model(x).sum().backward()                        # p.grad is None for the parameters another rank owns
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as tdist

from ....parallel.graph import output_tensors
from .mp_ops import group_rank, group_size

__all__ = ["ShardedGradients", "wants_sharded_gradients", "mark_partition", "owned_here", "GRAD_GROUP_ATTR",
           "PARTITION_ATTR"]

#: the attribute a stage-2 parameter carries: the group over which its gradient's owners are spread
GRAD_GROUP_ATTR = "sharded_grad_group"
#: and the ZeroRedundancyOptimizer whose partition says which rank of that group owns it
PARTITION_ATTR = "sharded_grad_partition"


def mark_partition(zero: Any) -> None:
    """Tell the parameters of ``zero`` (a ZeroRedundancyOptimizer) which optimizer partitions them, so that the
    model's stage-2 reduction finds each gradient's owner whatever optimizer object a loop passes around."""
    for group in zero.param_groups:
        for p in group["params"]:
            setattr(p, PARTITION_ATTR, zero)


def wants_sharded_gradients(hcg: Any, strategy: Any) -> bool:
    """Whether ``strategy`` asks for sharding stage 2 over the sharding axis of ``hcg`` (more than one rank)."""
    return (strategy is not None and getattr(strategy, "sharding_stage", 0) == 2 and hcg is not None
            and hcg.get_sharding_parallel_world_size() > 1)


def owned_here(params: list[torch.Tensor], group: Any) -> list[torch.Tensor]:
    """The parameters of ``params`` whose owner in the optimizer's partition is this rank of ``group``; all of them
    when no optimizer marked them (their gradients then exist only where the reduction left them)."""
    me = group_rank(group)
    return [p for p in params if (z := getattr(p, PARTITION_ATTR, None)) is None or z._param_to_rank.get(p) == me]


class ShardedGradients:
    """Reduces the gradients of ``params`` to their ZeRO owners in the sharding group and frees the others
    (Note [hybrid sharding stage 2]).

    Example::

        grads = ShardedGradients(model.parameters(), hcg)
        mark_partition(zero)            # fleet.distributed_optimizer does it for its ZeroRedundancyOptimizer
        loss.backward(); grads.reduce()
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], hcg: Any) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.group = hcg.get_sharding_parallel_group()
        self.dp_group = hcg.get_data_parallel_group() if hcg.get_data_parallel_world_size() > 1 else None
        self.divisor = group_size(self.group) * group_size(self.dp_group)
        self._queued = False
        for p in self.params:
            setattr(p, GRAD_GROUP_ATTR, self.group)

    def owners(self) -> list[int]:
        """The sharding rank that owns each parameter: its ZeroRedundancyOptimizer's partition, read now (it
        changes with ``add_param_group``)."""
        zeros = {id(z): z for p in self.params if (z := getattr(p, PARTITION_ATTR, None)) is not None}
        if len(zeros) != 1 or any(getattr(p, PARTITION_ATTR, None) is None for p in self.params):
            raise RuntimeError(
                "sharding stage 2 next to mp/pp: the gradients' owners come from the optimizer, but "
                + ("no fleet.distributed_optimizer holds these parameters yet; call fleet.distributed_optimizer(opt) "
                   "before the first backward" if not zeros else
                   "some trainable parameters are in no fleet.distributed_optimizer (or in several); build one "
                   "optimizer over all of model.parameters() (or set requires_grad=False on the others)"))
        to_rank = next(iter(zeros.values()))._param_to_rank
        return [to_rank[p] for p in self.params]

    def arm(self, outputs: Any) -> None:
        """Reduce at the end of the backward that goes through ``outputs`` (the forward's result). A forward run
        inside a backward (a checkpoint recomputing it) arms nothing: that backward is armed already."""
        if torch._C._current_graph_task_id() != -1:
            return
        self._queued = False  # (a backward that raised before its end left it set)
        for t in output_tensors(outputs):
            if t.grad_fn is not None:
                t.grad_fn.register_prehook(self._queue)

    def _queue(self, grad_outputs: Any) -> None:
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce_queued)

    def _reduce_queued(self) -> None:
        self._queued = False
        self.reduce()

    @torch.no_grad()
    def reduce(self) -> None:
        """Average the gradients over dp × sharding on their owners; free them elsewhere (collective)."""
        me = group_rank(self.group)
        parts: dict[tuple[int, torch.dtype], list[torch.nn.Parameter]] = {}
        for p, r in zip(self.params, self.owners()):
            parts.setdefault((r, p.dtype), []).append(p)
        mine: list[tuple[torch.Tensor, list[torch.nn.Parameter]]] = []
        for (r, _), ps in sorted(parts.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):  # same order everywhere
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])
            flat /= self.divisor  # Note [divide before sum]
            tdist.reduce(flat, dst=tdist.get_global_rank(self.group, r), group=self.group)
            if r == me:
                mine.append((flat, ps))
            else:
                for p in ps:
                    p.grad = None
        for flat, ps in mine:
            if self.dp_group is not None:
                tdist.all_reduce(flat, group=self.dp_group)
            offset = 0
            for p in ps:
                g = flat[offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
                offset += p.numel()
