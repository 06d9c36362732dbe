"""Uneven inputs: ``DataParallel`` as a torch ``Joinable``.

Note [join collectives]
    Under ``torch.distributed.algorithms.join.Join`` a rank that ran out of
    batches must still take part in every collective the others issue, in
    the same order. Per training forward a rank that has not joined issues:
    (1) Join's own "not joined" all-reduce (``Join.notify_join_context``),
    (2) one MAX all-reduce of ``[sync backward?, sync buffers?, rank]``,
    (3) the buffer broadcast from the largest rank not joined (if (2) says
    so), (4) the backward's bucket all-reduces (if (2) says so). A joined
    rank's :meth:`DataParallelJoinHook.main_hook` mirrors (2)-(4) with zeros, so
    joined ranks add nothing to the sums (with ``find_unused_parameters`` its
    used map is the last one it reduced, exactly as torch DDP's); the divisor stays the initial world size
    (torch DDP's default) or, with ``divide_by_initial_world_size=False``,
    is the count from (1). After every rank joined, the model of the largest
    last-joined rank is broadcast to all (torch DDP's ``_sync_final_model``).
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.join import JoinHook

from .comm import broadcast_coalesced

__all__ = ["DataParallelJoinHook", "announce_step", "common_rank"]


def common_rank(dp, candidate: bool) -> int:
    """The largest group rank among the candidates (torch DDP's ``_find_common_rank``)."""
    t = torch.tensor([tdist.get_rank(dp.group) if candidate else -1], device=dp.join_device)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=dp.group)
    return int(t.item())


def announce_step(dp, sync_backward: bool, sync_buffers: bool) -> tuple[bool, bool, int]:
    """Step (2) of Note [join collectives]: what this step does, and the rank to take buffers from."""
    t = torch.tensor([int(sync_backward), int(sync_buffers), tdist.get_rank(dp.group)], device=dp.join_device)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=dp.group)
    return bool(t[0]), bool(t[1]), int(t[2])


class DataParallelJoinHook(JoinHook):
    """Shadows a not-joined rank's forward and backward collectives (Note [join collectives]).

    Made by :meth:`DataParallel.join_hook`; torch's ``Join`` runs it on a rank that ran out of batches.

    Example::

        from torch.distributed.algorithms.join import Join
        with Join([model], divide_by_initial_world_size=False):
            for x in my_batches:                 # fewer on some ranks
                model(x).sum().backward()
    """

    def __init__(self, dp, divide_by_initial_world_size: bool = True):
        self.dp = dp
        dp._divide_by_initial_world_size = bool(divide_by_initial_world_size)

    def main_hook(self) -> None:
        dp = self.dp
        t = torch.tensor([0, 0, -1], device=dp.join_device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=dp.group)
        sync_backward, sync_buffers, src = bool(t[0]), bool(t[1]), int(t[2])
        dp.require_forward_param_sync = sync_backward  # as torch DDP's join hook (Note [buffer sync])
        if sync_buffers:
            broadcast_coalesced(dp._sync_buffers_list(), dp.group, src=src)
        if sync_backward:
            dp._reducer.shadow_backward()

    def post_hook(self, is_last_joiner: bool) -> None:
        dp = self.dp
        src = common_rank(dp, is_last_joiner)
        tensors = [p.data for p in dp._params_to_sync()]
        if dp._forward_sync_buffers:
            tensors += dp._sync_buffers_list()
        broadcast_coalesced(tensors, dp.group, src=src)
