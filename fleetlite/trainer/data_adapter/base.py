"""``DataAdapter``: what the loops need of their data, and nothing else.

Batches, ``len()`` of the current pass, ``set_epoch``, ``num_valid(i)`` (real samples of local batch ``i``,
the rest being padding), the position for checkpoints, whether the data is split across ranks, and the
dataset indices of each batch (for ``predict`` in dataset order). Each input kind has its own small
subclass (:mod:`fleetlite.trainer.data_adapter`); this base is the kind that knows nothing: an iterable
used as it is, not split across ranks, resumed by replaying it (Note [resume replay] in
:mod:`fleetlite.trainer.checkpoint_connector`).
"""

from __future__ import annotations

from typing import Any

from ...distributed import collective
from ...distributed.fleet.data_group import data_group

__all__ = ["DataAdapter", "describe_sizes", "data_split", "check_data_split"]


def data_split() -> dict[str, int]:
    """``num_replicas`` and ``rank`` of the samplers the Trainer builds: the data group's (Note [data group] in
    :mod:`fleetlite.distributed.fleet.data_group`: the dp group under mp/pp, else the world)."""
    g = data_group()
    return {"num_replicas": g.size, "rank": g.rank}


def check_data_split(num_replicas: int, rank: int, what: str) -> None:
    """Where the data group is narrower than the world (Note [data group]: fleet's plan splits models across
    ranks), a sampler the user built must split over that group only."""
    g = data_group()
    if g.size != collective.get_world_size() and (num_replicas, rank) != (g.size, g.rank):
        raise ValueError(f"{what} splits the data over {num_replicas} replicas (this rank {rank}), but under the "
                         f"hybrid topology the ranks of one tensor-parallel group or pipeline must read the same "
                         f"batches: split over the data-parallel group, num_replicas="
                         f"hcg.get_data_parallel_world_size() ({g.size}), rank=hcg.get_data_parallel_rank() "
                         f"({g.rank}); or pass the Dataset and let the Trainer split it")


class DataAdapter:
    """Uniform access to training/evaluation/prediction data; this base wraps any iterable as it is.

    Example::

        adapter = build_adapter(dataset, batch_size=32, shuffle=True)   # the subclass for this input kind
        adapter.set_epoch(0)
        for i, batch in enumerate(adapter):
            n_real = adapter.num_valid(i)
    """

    sampler: Any = None  # a DistributedBatchSampler (cursor, padding), when one drives the data
    sharded: bool = False  # each rank reads its own share (epoch logs are then reduced over ranks)

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    # -- iteration -----------------------------------------------------------------------------------------------
    def __iter__(self):
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def length(self) -> int | None:
        """``len()`` of the current/next pass, or None when the data has no length."""
        try:
            return len(self)
        except TypeError:
            return None

    def set_epoch(self, epoch: int) -> None:
        inner = getattr(self.loader, "sampler", None)
        if hasattr(inner, "set_epoch"):
            inner.set_epoch(epoch)

    # -- padding -------------------------------------------------------------------------------------------------
    def num_valid(self, index: int, batch: Any = None) -> int | None:
        """Leading real samples of local batch ``index`` of the current pass (None: all are real)."""
        return None

    def exact_reason(self) -> str | None:
        """Why evaluation over this data could not be exact (None when it is)."""
        if getattr(self.loader, "drop_last", False):
            return ("the DataLoader drops the last incomplete batch (drop_last=True), so some samples are never "
                    "evaluated; use drop_last=False for evaluation data")
        return None

    # -- position ------------------------------------------------------------------------------------------------
    @property
    def resumable(self) -> bool:
        """True when the position can be saved and restored without replaying batches."""
        return False

    def position(self, consumed: int) -> dict[str, Any] | None:
        """The position after ``consumed`` local batches of the current pass (plain values)."""
        return None

    def load_position(self, state: dict[str, Any]) -> None:
        return None

    # -- indices (predict) ---------------------------------------------------------------------------------------
    def pass_indices(self) -> list[list[int]] | None:
        """Dataset indices of each local batch of the next pass, without moving the data's position."""
        return None


def describe_sizes(adapter: DataAdapter) -> str:
    """``"5 samples, batch size 8 per rank, 1 rank, drop_last=True"`` (what is known of them)."""
    loader = getattr(adapter, "loader", None)
    owner = adapter.sampler if adapter.sampler is not None else loader
    parts = []
    for obj in (owner, getattr(owner, "dataset", None), loader):
        dataset = getattr(obj, "dataset", None)
        if dataset is not None and hasattr(dataset, "__len__"):
            parts.append(f"{len(dataset)} samples")
            break
    bs = getattr(owner, "batch_size", None) or getattr(loader, "batch_size", None)
    if bs:
        parts.append(f"batch size {bs} per rank")
    ranks = getattr(owner, "nranks", None) or getattr(owner, "num_replicas", None) or 1
    parts.append(f"{ranks} rank{'s' if ranks != 1 else ''}")
    drop = getattr(owner, "drop_last", getattr(loader, "drop_last", None))
    if drop is not None:
        parts.append(f"drop_last={drop}")
    return ", ".join(parts)
