"""The reducer's error and warning messages, raised the same way on every rank."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as tdist

__all__ = ["TAIL_FLAGS", "SYNC_CHECK_ITERS", "StepChecks", "ready_twice_error", "missing_error", "interrupted_error",
           "warn_discarded", "hook_result_error", "gather_names"]

TAIL_FLAGS = 2  # Note [bucket tail]: [missing-gradient count, interrupted-rank count], then the used map
SYNC_CHECK_ITERS = 2  # Note [bucket tail]: synchronous checks in the first synced steps

_RECOMPUTE_HINT = (
    "This happens when one parameter's gradient is accumulated in two backward passes of one step: a "
    "PyLayer / reentrant checkpoint (torch.utils.checkpoint(..., use_reentrant=True)) that runs the same "
    "layers twice or shares weights across checkpoints, a parameter used outside forward(), or backward run "
    "twice for one forward. Fixes, as with torch DDP: wrap with DataParallel(model, static_graph=True) when "
    "the set of used parameters is the same every step; or use torch.utils.checkpoint(..., "
    "use_reentrant=False); or run such steps under `model.no_sync()` and call "
    "`fused_allreduce_gradients(list(model.parameters()), None)` before the optimizer step. With "
    "find_unused_parameters=True, the parameters inside a reentrant checkpoint are not seen by the graph "
    "walk after forward: use static_graph=True instead."
)


def ready_twice_error(name: str) -> RuntimeError:
    return RuntimeError(
        f"Expected to mark a variable ready only once. DataParallel: parameter {name!r} received a gradient "
        "after it was already marked ready in this "
        f"backward pass (its bucket may already be reduced). {_RECOMPUTE_HINT}"
    )


def gather_names(names: list[str], missing: list[int], group, world: int) -> list[list[str]]:
    """Every rank's list of parameter names; a collective (every rank calls it at the same point)."""
    everyone: list = [None] * world
    tdist.all_gather_object(everyone, [names[i] for i in missing], group=group)
    return everyone


def _rpc_initialized() -> bool:
    try:
        from torch.distributed import rpc
        return rpc.is_available() and rpc.api._is_current_rpc_agent_set()
    except (ImportError, AttributeError):
        return False


def missing_error(names: list[str], missing: list[int], group, world: int) -> RuntimeError:
    """The 'no gradient' error; a collective: every rank calls it at the same point (Note [bucket tail])."""
    everyone = gather_names(names, missing, group, world)
    if _rpc_initialized() and all(len(ns) == len(names) for ns in everyone):
        return RuntimeError(
            "DataParallel: no parameter received a gradient in .grad on any rank, and torch.distributed.rpc is "
            "initialized. A backward through RPC's distributed autograd (dist_autograd.backward(context_id, "
            "[loss])) puts the gradients into the RPC autograd context, not into .grad, and fleetlite's engine "
            "averages .grad only: distributed autograd is not supported. Wrap this model in "
            "torch.nn.parallel.DistributedDataParallel (which supports it), or call loss.backward() "
            "outside dist_autograd.")
    detail = "; ".join(f"rank {r}: {', '.join(ns[:10])}{' ...' if len(ns) > 10 else ''}"
                       for r, ns in enumerate(everyone) if ns)
    return RuntimeError(
        "DataParallel: some parameters received no gradient in this backward pass, so their all-reduce "
        f"could not be matched across ranks ({detail}). If parts of the model are legitimately unused in "
        "some steps, wrap it with DataParallel(model, find_unused_parameters=True); if they are never "
        "used, remove them or set requires_grad=False."
    )


def hook_result_error(hook, result) -> RuntimeError:
    """A communication hook returned something else than a future (torch DDP's message, with the fix)."""
    name = getattr(hook, "__qualname__", type(hook).__name__)
    return RuntimeError(
        f"callback must return a torch.futures.Future object, but got {type(result).__name__}: the communication "
        f"hook {name} registered with register_comm_hook returned {type(result).__name__} for a gradient bucket. "
        "A hook must return a torch.futures.Future holding the reduced bucket, e.g. "
        "`fut = torch.futures.Future(); fut.set_result(bucket.buffer()); return fut`, or the future of an async "
        "collective: `dist.all_reduce(bucket.buffer(), async_op=True).get_future()`.")


def interrupted_error(ranks: int) -> RuntimeError:
    return RuntimeError(
        f"DataParallel: the backward pass of this step was interrupted by an exception on {ranks} other "
        "rank(s) (e.g. an out-of-memory error that was caught). Their gradients for this step never came, so "
        "this rank's averaged gradients would be wrong: they were discarded (.grad is None) and this rank "
        "is back in step with the others. Skip the optimizer step for this batch (catch this error as the "
        "other ranks caught theirs) and go on with the next one."
    )


def warn_discarded(done: int, total: int) -> None:
    warnings.warn(
        f"DataParallel: the previous backward pass raised after {done} of {total} gradient buckets were "
        "sent for all-reduce. The step's remaining all-reduces were completed (as zeros) so that the ranks "
        "stay matched, and its gradients were discarded (.grad is None, including any accumulated under "
        "no_sync). Ranks whose backward had completed raise an error telling them to skip this step.",
        RuntimeWarning, stacklevel=4,
    )


class StepChecks:
    """The reducer's end-of-step checks, interrupted-step recovery and joined-rank shadowing.

    A mixin of :class:`~fleetlite.parallel.reducer.Reducer` (its state lives there); see
    Note [bucket tail], Note [used map] and Note [interrupted backward] in reducer.py.
    """

    def _after_reduce(self) -> None:
        tail = self.tail
        if tail is None:
            return
        track = self.track_used and (self.find_unused or self._delay)
        defer = (tail.is_cuda if self.defer_checks is None else self.defer_checks) and self.check_lag > 0
        if track or not defer or self._iteration <= SYNC_CHECK_ITERS:
            flags = tail.tolist() if track else tail[:TAIL_FLAGS].tolist()
            self._check_flags(flags[:TAIL_FLAGS], self._missing)
            if track:
                used = flags[TAIL_FLAGS:]
                self._last_used = used
                if self._delay:
                    self._static_used = used
                self._leave_unused(used)
        else:  # Note [bucket tail]: no host sync in a steady-state CUDA step
            event = None
            if tail.is_cuda:
                host = torch.empty(TAIL_FLAGS, dtype=tail.dtype, pin_memory=True)
                host.copy_(tail[:TAIL_FLAGS], non_blocking=True)
                event = torch.cuda.Event()
                event.record()
            else:
                host = tail[:TAIL_FLAGS].clone()
            self._deferred.append((host, event, list(self._missing)))
        if self._static_used is not None and not self._delay:
            self._leave_unused(self._static_used)
        if self.track_used:
            self._local_used = [False] * len(self.params)

    def _leave_unused(self, used: list[float]) -> None:
        for i, u in enumerate(used):
            if u == 0.0 and self._was_none[i]:
                self.params[i].grad = None  # used on no rank: leave it as torch DDP does (Note [used map])

    def _check_flags(self, flags: list[float], missing: list[int]) -> None:
        if flags[1] > 0:  # Note [interrupted backward]: another rank's step was cut short
            self._discard()
            raise interrupted_error(int(round(flags[1])))
        if flags[0] > 0:
            raise self._missing_error(missing)

    def _missing_error(self, missing: list[int]) -> RuntimeError:
        """The error for parameters that got no gradient (a collective; a face's reducer may word it)."""
        return missing_error(self.names, missing, self.group, self.world)

    def check_deferred(self, lag: int = 1) -> None:
        """Raise, on every rank, what a deferred tail reported (Note [bucket tail]).

        Keeps the newest ``lag`` tails unread: with ``lag=1`` a forward reads the tail of the step
        before the previous one, which the device finished long ago, so the read does not wait.
        """
        while len(self._deferred) > lag:
            host, event, missing = self._deferred.pop(0)
            if event is not None:
                event.synchronize()
            self._check_flags(host.tolist(), missing)

    # ------------------------------------------------- interrupted backward
    def resume_if_interrupted(self) -> None:
        """Note [interrupted backward]: finish a synced step whose backward raised, and discard it."""
        self.check_deferred(self.check_lag)
        if not self._expect_hooks:
            return
        self._expect_hooks = False
        if not (self._fired or self._works):
            return  # nothing was launched or marked: as torch DDP, simply start over
        with self._lock:
            done = self._next
            self._complete_step(aborted=True)
            self._wait_all()
            self._discard()
            if self.track_used:
                self._local_used = [False] * len(self.params)
        warn_discarded(done, len(self.buckets))

    def _discard(self) -> None:
        for b in self.buckets:
            b.buffer.zero_()
        for p in self.params:
            p.grad = None

    # ----------------------------------------------------------------- join
    def shadow_backward(self) -> None:
        """A joined rank's side of one synced backward: every bucket's all-reduce, with zeros, in order.

        As torch DDP's joined rank, it contributes no gradient and no flag, but with
        ``find_unused_parameters`` its used map is the last one it reduced (DDP all-reduces its
        ``local_used_map_dev_``, which keeps the previous result): numbers equal to DDP's join.
        """
        last = len(self.buckets) - 1
        tail = self.tail
        shadow_tail = torch.zeros_like(tail) if tail is not None else None
        for b in self.buckets:
            z = torch.zeros_like(b.buffer)  # zeros: a joined rank contributes nothing (and no tail flag)
            if b.index == last and tail is not None:
                if self.comm_hook is None:  # Note [bucket tail]: rides on the last bucket
                    shadow_tail = z[b.numel:]
                if self.find_unused and self._last_used is not None:
                    shadow_tail[TAIL_FLAGS:] = torch.tensor(self._last_used, dtype=z.dtype)
            grads = [z.as_strided(v.shape, v.stride(), v.storage_offset())
                     for v in (self.views[i] for i in b.param_indices)]
            self._communicate(b, z, grads)
        self.tail = shadow_tail
        try:
            self._wait_all()
        finally:
            self.tail = tail
        if self.find_unused and shadow_tail is not None:
            self._last_used = shadow_tail[TAIL_FLAGS:].tolist()
