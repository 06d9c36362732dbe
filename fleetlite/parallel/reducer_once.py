"""Paddle's reducer rule for unused parameters: found once, on the first step (the Paddle face's reducer).

Note [find unused once]
    Paddle's ``EagerReducer`` (paddle/fluid/distributed/collective/reducer.cc)
    walks the autograd graph of the first synced forward even when
    ``find_unused_parameters=False`` (``find_unused_vars_once_``) and, in every
    step after, marks the parameters it found unreached as ready (their slot
    reduced as zeros) without walking again. A model with parameters it never
    uses therefore trains under Paddle where torch DDP stops. This reducer does
    the same, with three things Paddle leaves out:

    * the set is agreed once across ranks (one small all-reduce in the first
      synced forward): a parameter unused on *every* rank keeps ``.grad``
      ``None`` (Paddle's result), one used on some rank gets the average on
      every rank (Paddle would leave ``None`` on the rank that did not use it,
      so that rank's optimizer would skip it and the replicas drift apart);
    * when the set changes later (a parameter found unused gets a gradient, or
      one found used gets none), every rank raises the same error naming the
      parameters and the fix (``find_unused_parameters=True``); Paddle raises
      on the rank that saw it, and the others may wait forever. Both ride on the
      bucket tail (Note [bucket tail] in reducer.py): a gradient that arrives
      for a parameter of the set counts as a missing one;
    * so that such a late gradient is always counted before the tail is sent,
      the last bucket (the one carrying the tail, the first layers, whose
      gradients come last anyway) is launched at the end of backward while the
      set is not empty.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

from .graph import reachable_params
from .reducer import Reducer
from .reducer_checks import gather_names

__all__ = ["FindOnceReducer"]


class FindOnceReducer(Reducer):
    """:class:`Reducer` with Paddle's ``find_unused_vars_once``; see Note [find unused once]."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._once: list[int] | None = None  # the parameters found unused on the first synced step (this rank)
        self._once_mask: list[bool] | None = None
        self._unused_everywhere: list[int] = []  # ... and on every rank: .grad None stays None
        self._hold_last = False

    @property
    def _finds_once(self) -> bool:
        return not (self.find_unused or self.static_graph)

    # -------------------------------------------------------- the first step
    def _unused_up_front(self, outputs) -> list[int]:
        if not self._finds_once:
            return super()._unused_up_front(outputs)
        if self._once is None:
            reached = reachable_params(outputs)
            self._found([p not in reached for p in self.params])
        self._hold_last = bool(self._once)
        if self._hold_last:
            self._pending[-1] += 1  # released in _finalize, after every hook of this backward ran
        return self._once

    def _found(self, unused: list[bool]) -> None:
        """Agree the set once: how many ranks found each parameter unused (a collective)."""
        counts = torch.tensor(unused, dtype=torch.int32, device=self.buckets[0].device)
        tdist.all_reduce(counts, group=self.group)
        everywhere = counts.tolist()
        self._once = [i for i, u in enumerate(unused) if u]
        self._once_mask = list(unused) if self._once else None  # None: the hooks' fast path
        self._unused_everywhere = [i for i in self._once if everywhere[i] == self.world]

    def shadow_backward(self) -> None:
        """A joined rank mirrors the first step's agreement too (Note [join collectives] in join.py)."""
        if self._finds_once and self._once is None:
            self._found([False] * len(self.params))
        super().shadow_backward()

    # ------------------------------------------------------------ every step
    def _on_grad(self, i: int) -> None:
        mask = self._once_mask
        if mask is not None and mask[i] and self._expect_hooks:
            with self._lock:  # found unused on the first step, used now: counted, reported at the tail
                if i not in self._missing:
                    self._missing.append(i)
                self._fired = True
                self._queue_finalize()
            return
        super()._on_grad(i)

    def _finalize(self) -> None:
        if self._hold_last and self._expect_hooks:
            with self._lock:
                self._hold_last = False
                self._pending[-1] -= 1
                self._launch_ready()
        super()._finalize()

    def _after_reduce(self) -> None:
        for i in self._unused_everywhere:
            if self._was_none[i]:
                self.params[i].grad = None  # as Paddle: never had a gradient, gets none
        super()._after_reduce()

    def _missing_error(self, missing: list[int]) -> RuntimeError:
        if not self._finds_once:
            return super()._missing_error(missing)
        everyone = gather_names(self.names, sorted(missing), self.group, self.world)
        once = {self.names[i] for i in (self._once or ())}

        def show(ns: list[str]) -> str:
            now_used = [n for n in ns if n in once]
            now_unused = [n for n in ns if n not in once]
            parts = []
            if now_unused:
                parts.append(", ".join(now_unused[:10]) + (" ..." if len(now_unused) > 10 else "")
                             + " (used on the first step, no gradient now)")
            if now_used:
                parts.append(", ".join(now_used[:10]) + (" ..." if len(now_used) > 10 else "")
                             + " (unused on the first step, a gradient now)")
            return "; ".join(parts)

        detail = "; ".join(f"rank {r}: {show(ns)}" for r, ns in enumerate(everyone) if ns)
        return RuntimeError(
            "DataParallel: the set of parameters that receive no gradient changed since the first training step "
            f"({detail}). As Paddle's DataParallel with find_unused_parameters=False, fleetlite finds the unused "
            f"parameters once, on the first step ({len(once)} on this rank), and reduces them as unused ever "
            "after, so a change cannot be matched across ranks. If the parameters a step uses change from step "
            "to step, wrap the model with DataParallel(model, find_unused_parameters=True) (the graph is walked "
            "every step); if some are never used, remove them or set requires_grad=False."
        )
