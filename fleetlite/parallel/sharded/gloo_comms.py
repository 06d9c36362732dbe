"""FSDP2's all-gather and reduce-scatter over gloo, as all-reduces (CPU runs of sharding stages 2/3).

# Note [gloo sharded collectives]
On gloo, torch's ``all_gather_single`` and ``reduce_scatter_single`` are far
slower than its ring ``all_reduce`` of the same buffer (measured on 2 ranks,
100 MB float32, one thread each: all_reduce 68-78 ms, reduce_scatter 155 ms,
all_gather 109-126 ms). FSDP2 lets a model replace both
(``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``); on
gloo groups we do each as one all-reduce:

* all-gather: each rank writes its shard into its slot of a zeroed output and
  the output is summed (``x + 0 == x`` exactly, so the gathered parameters are
  the shards bit for bit, except that a ``-0.0`` comes back as ``0.0``);
* reduce-scatter: the whole input is all-reduced with the requested op and the
  rank keeps its chunk (the sum of two ranks is the same either way; with more
  ranks the summation order is gloo's all-reduce's, as DDP's is).

NCCL (GPUs) keeps FSDP2's own collectives, which are as fast as an all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

__all__ = ["GlooAllGather", "GlooReduceScatter", "use_gloo_comms"]


class _Alloc:
    """The buffer half of FSDP2's ``Comm`` interface (``torch.distributed.fsdp``'s ``AllGather`` and
    ``ReduceScatter``, duck-typed: importing FSDP2 costs ~0.5 s, paid only by the sharded stages)."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class GlooAllGather(_Alloc):
    """All-gather as one all-reduce of a zeroed buffer holding this rank's shard (Note [gloo sharded collectives])."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, async_op: bool = False):
        n = input_tensor.numel()
        rank = tdist.get_rank(group)
        flat = output_tensor.view(-1)
        flat[:rank * n].zero_()
        flat[(rank + 1) * n:].zero_()
        mine = flat[rank * n:(rank + 1) * n]
        if mine.data_ptr() != input_tensor.data_ptr():  # FSDP2 copies its input into this slot already (in place)
            mine.copy_(input_tensor.view(-1))
        return tdist.all_reduce(output_tensor, group=group, async_op=async_op)


class GlooReduceScatter(_Alloc):
    """Reduce-scatter as one all-reduce of the input, this rank's chunk kept (Note [gloo sharded collectives])."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op,
                 async_op: bool = False):
        n = output_tensor.numel()
        rank = tdist.get_rank(group)
        tdist.all_reduce(input_tensor, op=op, group=group)
        output_tensor.view(-1).copy_(input_tensor.view(-1)[rank * n:(rank + 1) * n])
        return None


def use_gloo_comms(modules, group) -> bool:
    """Give every FSDP module in ``modules`` the all-reduce based collectives when ``group`` is a gloo group."""
    if group is None or tdist.get_backend(group) != "gloo":
        return False
    for module in modules:
        module.set_custom_all_gather(GlooAllGather())
        module.set_custom_reduce_scatter(GlooReduceScatter())
    return True
