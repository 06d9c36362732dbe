"""``fleet.util``: Paddle's ``UtilBase`` (small collectives on plain Python/numpy values, file sharding, rank prints).

Paddle runs these on gloo between the workers; here they run on the job's
``torch.distributed`` process group (the one ``fleet.init`` started), and
single-process they act on a world of one. Collective training has workers
only: ``comm_world="worker"`` and ``"all"`` are the same group, and
``"server"`` (parameter-server training) is refused.

``fleet.util`` is a module attribute holding a ``UtilBase``; a program may
replace it by its own subclass, as in Paddle::

    from fleetlite.distributed import fleet

    class MyUtil(fleet.UtilBase):
        def get_user_id(self):
            return 10

    fleet.util = MyUtil()
    assert fleet.util.get_user_id() == 10
    print(fleet.util.all_reduce([1, 2], mode="sum"))   # [1 2] * world size
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import collective

__all__ = ["UtilBase", "UtilFactory"]

_MODES = {"sum": collective.ReduceOp.SUM, "min": collective.ReduceOp.MIN, "max": collective.ReduceOp.MAX}
_WORLDS = ("worker", "server", "all")


def _check_world(comm_world: str) -> None:
    if comm_world not in _WORLDS:
        raise ValueError(f"comm_world must be one of {', '.join(map(repr, _WORLDS))}, got {comm_world!r}")
    if comm_world == "server":
        raise ValueError("comm_world='server': collective training has no parameter servers (every process is a "
                         "worker); use comm_world='worker'")


class UtilBase:
    """Paddle's ``fleet.UtilBase``: ``all_reduce``, ``all_gather``, ``barrier`` between the workers,
    ``get_file_shard`` and ``print_on_rank``. Subclass it to add your own helpers (``fleet.util = MyUtil()``).

    Example::

        from fleetlite.distributed import fleet
        fleet.init(is_collective=True)
        files = fleet.util.get_file_shard(["a", "b", "c", "d", "e"])   # rank 0 of 2: ['a', 'b', 'c']
        total = fleet.util.all_reduce(np.array([len(files)]), mode="sum")   # array([5])
    """

    def __init__(self) -> None:
        self.role_maker: Any = None
        self.dist_strategy: Any = None

    def _set_strategy(self, dist_strategy: Any) -> None:
        self.dist_strategy = dist_strategy

    def _set_role_maker(self, role_maker: Any) -> None:
        self.role_maker = role_maker

    def _rank(self) -> int:
        if self.role_maker is not None and hasattr(self.role_maker, "worker_index"):
            return self.role_maker.worker_index()
        return collective.get_rank()

    def _world(self) -> int:
        if self.role_maker is not None and hasattr(self.role_maker, "worker_num"):
            return self.role_maker.worker_num()
        return collective.get_world_size()

    def all_reduce(self, input: Sequence[Any] | np.ndarray, mode: str = "sum",
                   comm_world: str = "worker") -> np.ndarray:
        """Reduce ``input`` (a number, a nested list/tuple of numbers or a numpy array) over the workers by
        ``mode`` ("sum", "min" or "max"); every worker gets a numpy array of ``input``'s shape."""
        if mode not in _MODES:
            raise ValueError(f"mode must be 'sum', 'min' or 'max', got {mode!r}")
        _check_world(comm_world)
        array = np.asarray(list(input) if isinstance(input, tuple) else input)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"all_reduce needs numbers (a list, tuple or numpy array of them), got {input!r}")
        integral = array.dtype.kind in "biu"
        tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64 if integral else np.float64))
        if collective.is_initialized():
            device = collective.collective_device("cpu")
            moved = tensor.to(device)
            collective.all_reduce(moved, op=_MODES[mode])
            tensor = moved.cpu()
        return tensor.numpy().reshape(array.shape)

    def barrier(self, comm_world: str = "worker") -> None:
        """Wait until every worker arrives (a no-op single-process)."""
        _check_world(comm_world)
        collective.barrier()

    def all_gather(self, input: Any, comm_world: str = "worker") -> list[Any]:
        """Every worker's ``input`` (a number, or any picklable value), in rank order."""
        _check_world(comm_world)
        return collective.all_gather_object(input)

    def get_file_shard(self, files: list[str]) -> list[str]:
        """This worker's share of ``files``: contiguous blocks, the first ``len(files) % workers`` one longer.

        ``[a, b, c, d, e]`` on 2 workers: worker 0 gets ``[a, b, c]``, worker 1 ``[d, e]``; ``[a, b]`` on 3:
        ``[a]``, ``[b]``, ``[]`` (Paddle's split).
        """
        if not isinstance(files, list):
            raise TypeError(f"files should be a list of file need to be read, got {type(files).__name__}")
        rank, world = self._rank(), self._world()
        size, extra = divmod(len(files), world)
        begin = rank * size + min(rank, extra)
        return files[begin:begin + size + (1 if rank < extra else 0)]

    def print_on_rank(self, message: str, rank_id: int) -> None:
        """Print ``message`` on the worker whose rank is ``rank_id`` only."""
        if self._rank() == rank_id:
            print(message)


class UtilFactory:
    """Paddle's ``UtilFactory``: builds the ``UtilBase`` that ``fleet.init`` installs as ``fleet.util``."""

    def _create_util(self, context: dict[str, Any] | None = None) -> UtilBase:
        util = UtilBase()
        if context is not None and "valid_strategy" in context:
            util._set_strategy(context["valid_strategy"])
        if context is not None and "role_maker" in context:
            util._set_role_maker(context["role_maker"])
        return util
