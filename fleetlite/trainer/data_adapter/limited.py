"""``LimitedAdapter``: the first ``num_iters`` batches of another adapter (Paddle's ``evaluate(num_iters=)``)."""

from __future__ import annotations

import itertools
from typing import Any

from .base import DataAdapter

__all__ = ["LimitedAdapter"]


class LimitedAdapter(DataAdapter):
    """The first ``num_iters`` batches of ``adapter``; everything else (padding, position, ...) is the adapter's.

    Example::

        first_ten = LimitedAdapter.wrap(build_adapter(eval_set, batch_size=64), 10)
    """

    def __init__(self, adapter: DataAdapter, num_iters: int) -> None:
        if isinstance(num_iters, bool) or not isinstance(num_iters, int) or num_iters < 1:
            raise ValueError(f"num_iters={num_iters!r} must be a positive integer")
        super().__init__(getattr(adapter, "loader", None))
        self.inner, self.num_iters = adapter, num_iters
        self.sampler, self.sharded = adapter.sampler, adapter.sharded

    @classmethod
    def wrap(cls, adapter: DataAdapter, num_iters: int) -> LimitedAdapter:
        return cls(adapter, num_iters)

    def __iter__(self):
        return itertools.islice(iter(self.inner), self.num_iters)

    def __len__(self) -> int:
        return len(self.inner)

    def length(self) -> int | None:
        n = self.inner.length()
        return self.num_iters if n is None else min(n, self.num_iters)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def num_valid(self, index: int, batch: Any = None) -> int | None:
        return self.inner.num_valid(index, batch)

    def exact_reason(self) -> str | None:
        return self.inner.exact_reason()

    @property
    def resumable(self) -> bool:
        return self.inner.resumable

    def position(self, consumed: int) -> dict[str, Any] | None:
        return self.inner.position(consumed)

    def load_position(self, state: dict[str, Any]) -> None:
        self.inner.load_position(state)

    def pass_indices(self) -> list[list[int]] | None:
        return self.inner.pass_indices()
