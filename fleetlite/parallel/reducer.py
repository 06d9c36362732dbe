"""The gradient reducer: flat bucket buffers, per-parameter hooks, in-order async all-reduce.

Note [grad views]
    Each bucket is one flat buffer and ``param.grad`` is a view into it, so a
    gradient is stored once and needs no copy before the all-reduce. A view
    has its parameter's strides when the parameter is dense and
    non-overlapping (a ``channels_last`` weight gets a ``channels_last``
    gradient, as in torch DDP), else it is a plain reshaped slice. When a
    user sets grads to ``None`` (``zero_grad(set_to_none=True)``), autograd
    hands the next gradient over as a fresh tensor; the hook copies it into
    the bucket slot and points ``param.grad`` back at the view.

Note [divide before sum]
    A bucket is scaled by ``1/world`` before the all-reduce (as torch DDP
    does), so fp16 sums cannot overflow where the mean would not, and the
    result is the mean with DDP's exact rounding. Under ``join()`` with
    ``divide_by_initial_world_size=False`` the divisor is the number of
    ranks not yet joined. With a communication hook the hook divides
    (Note [hook buffers] in comm_hooks.py).

Note [bucket tail]
    The bucket reduced last carries a few extra elements after the
    gradients: slot 0 counts parameters that got no gradient on some rank
    (an error without ``find_unused_parameters``), slot 1 counts ranks whose
    backward was interrupted (Note [interrupted backward]), then one "used"
    slot per parameter when ``find_unused_parameters`` or ``static_graph``
    is on. Riding on the last all-reduce, every rank learns of a missing
    gradient anywhere at no extra collective, and all ranks raise the same
    error instead of hanging. The tail is read on the host right after the
    step when it lives on the CPU (the all-reduce was waited anyway), in the
    first iterations, under ``join()``, and with ``find_unused_parameters`` (as
    torch DDP reads its used map); otherwise (CUDA, steady state) it is copied
    to pinned memory without blocking and read one forward later (step k's
    tail at forward k+2, which the device finished long ago), so a normal
    synced step never waits on the host. Every rank reads at the same forward,
    so the error is still raised on every rank, never a hang.

Note [used map]
    A parameter is *used* when its gradient hook fired with a defined
    gradient, in the synced backward or in any ``no_sync`` backward of the
    same accumulation window (torch DDP's ``local_used_map``). A parameter
    used on no rank keeps the ``.grad`` it had (``None`` stays ``None``); a
    parameter used on some rank gets the average everywhere.

Note [interrupted backward]
    An exception in the middle of a synced backward leaves all-reduces
    launched for some buckets and not for others. At the next forward the
    rank completes that step's collectives (the missing buckets as zeros,
    slot 1 of the tail set), waits for all of them and discards the step's
    gradients (``.grad`` becomes ``None``), so the ranks stay matched and no
    stale all-reduce writes into a later step. A rank whose own backward
    completed learns from the tail that the step was interrupted elsewhere
    and raises instead of keeping a wrong average.

Note [finalize in the outer backward]
    The end-of-backward callback is queued from a pre-hook on the forward
    outputs' graph nodes, i.e. in the outermost backward. A reentrant
    checkpoint runs a nested backward whose own end must not finalize the
    step (torch DDP's ``test_ddp_checkpointing_once``).

See also Note [bucket order] and Note [last bucket] in buckets.py.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as tdist

from .buckets import Bucket, module_units, plan_buckets
from .comm_hooks import GradBucket, future_tensor
from .graph import dense, output_tensors, reachable_params
from .reducer_checks import TAIL_FLAGS, StepChecks, hook_result_error, ready_twice_error

__all__ = ["Reducer"]

_FUSED_SCALE_NUMEL = 1 << 18


class Reducer(StepChecks):
    """Averages the gradients of ``params`` across ``group`` during backward."""

    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]], group, world_size: int,
                 comm_buffer_size: float, last_comm_buffer_size: float, find_unused_parameters: bool,
                 comm_dtype: torch.dtype | None = None, static_graph: bool = False):
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.group = group
        self.world = world_size
        self.static_graph = static_graph
        self.find_unused = find_unused_parameters and not static_graph  # DDP ignores it with a static graph
        self.track_used = find_unused_parameters or static_graph
        self.comm_dtype = comm_dtype
        self.buckets: list[Bucket] = plan_buckets(self.params, comm_buffer_size, last_comm_buffer_size,
                                                  units=module_units(self.names))
        n = len(self.params)
        self.param_bucket = [0] * n
        self.views: list[torch.Tensor | None] = [None] * n
        self.tail: torch.Tensor | None = None
        self.comm_hook = None
        self.comm_hook_state = None
        self._hooks = []
        self._lock = threading.Lock()
        if world_size > 1 and n:
            self._allocate()
            self._register_hooks()
        self._expect_hooks = False
        self._queued = False
        self._fired = False
        self._works: list = []
        self._inv_world = 1.0 / world_size
        self._iteration = 0
        self._deferred: list = []
        self.defer_checks: bool | None = None  # None: defer on CUDA only (Note [bucket tail])
        self.check_lag = 1  # 0 under join(): every rank reads its tails before it may join
        self._local_used = [False] * n
        self._static_counts: list[int] | None = None  # hook calls per parameter, from the first iteration
        self._static_used: list[float] | None = None
        self._last_used: list[float] | None = None  # the used map last reduced (join: see shadow_backward)
        # per-call overhead dominates below this size: copy, then scale the whole bucket at once
        self._big = [p.numel() >= _FUSED_SCALE_NUMEL for p in self.params]

    # ------------------------------------------------------------------ setup
    def _allocate(self) -> None:
        tail_len = TAIL_FLAGS + (len(self.params) if self.track_used else 0)
        last = len(self.buckets) - 1
        for b in self.buckets:
            extra = tail_len if b.index == last else 0
            b.buffer = torch.zeros(b.numel + extra, dtype=b.dtype, device=b.device)
            for i, off in zip(b.param_indices, b.offsets):
                p = self.params[i]
                self.param_bucket[i] = b.index
                if dense(p):  # Note [grad views]: keep the parameter's memory format
                    view = b.buffer.as_strided(p.shape, p.stride(), b.buffer.storage_offset() + off)
                else:
                    view = b.buffer[off:off + p.numel()].view(p.shape)
                if p.grad is not None:  # else stays None until a gradient arrives, as in plain torch
                    view.copy_(p.grad)
                    p.grad = view
                self.views[i] = view
            if extra:
                self.tail = b.buffer[b.numel:]

    def _register_hooks(self) -> None:
        for i, p in enumerate(self.params):
            self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(i)))

    def _make_hook(self, i: int):
        def hook(_param):
            self._on_grad(i)

        return hook

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def set_divisor(self, divisor: int) -> None:
        """Average over ``divisor`` ranks in the next synced backward (see Note [divide before sum])."""
        self._inv_world = 1.0 / divisor

    # ------------------------------------------------------------- per step
    def prepare_for_backward(self, outputs) -> None:
        """Called after each forward that will be followed by a synced backward."""
        for b in self.buckets:  # the plan is of the wrapped dtypes/devices; a cast after wrapping breaks it
            p = self.params[b.param_indices[0]]
            if p.dtype != b.dtype or p.device != b.device:
                raise RuntimeError(
                    f"DataParallel: parameter {self.names[b.param_indices[0]]!r} is now {p.dtype} on {p.device} "
                    f"but was {b.dtype} on {b.device} when the model was wrapped. Move or cast the model "
                    "(.to(), .double(), .half()) before wrapping it in DataParallel / fleet.distributed_model."
                )
        self.resume_if_interrupted()
        n = len(self.params)
        self._ready = [False] * n
        self._pending = [len(b.param_indices) for b in self.buckets]
        self._next = 0
        self._works = []
        self._missing: list[int] = []
        self._was_none = [False] * n
        self._prescaled = [False] * n
        self._n_prescaled = [0] * len(self.buckets)
        self._counts = [0] * n
        self._delay = self.static_graph and self._static_counts is None
        self._fired = False
        self._queued = False
        self._expect_hooks = True
        self._hook_outer_backward(outputs)
        if self._delay:
            return
        for i in self._unused_up_front(outputs):
            self._take_grad(i)
            self._ready[i] = True
            self._pending[self.param_bucket[i]] -= 1

    def _unused_up_front(self, outputs) -> list[int]:
        """The parameters marked ready before backward (their slots are reduced as zeros)."""
        if self._static_counts is not None:
            return [i for i, c in enumerate(self._static_counts) if c == 0]
        if self.find_unused:
            reached = reachable_params(outputs)
            return [i for i, p in enumerate(self.params) if p not in reached]
        return []

    def _hook_outer_backward(self, outputs) -> None:
        # Note [finalize in the outer backward]
        for t in output_tensors(outputs):
            if t.grad_fn is not None:
                t.grad_fn.register_prehook(self._outer_prehook)

    def _outer_prehook(self, grad_outputs):
        if self._expect_hooks and not self._queued:
            with self._lock:
                self._queue_finalize()
        return None

    def _queue_finalize(self) -> None:
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)

    def _on_grad(self, i: int) -> None:
        # hooks may fire on two autograd threads (parameters on two devices): one at a time
        with self._lock:
            if self.track_used and self.params[i].grad is not None:
                self._local_used[i] = True  # Note [used map], also under no_sync
            if not self._expect_hooks:
                return
            self._fired = True
            self._queue_finalize()
            if self._delay or self._static_counts is not None:
                self._counts[i] += 1
                if self._delay or self._counts[i] < self._static_counts[i]:
                    self._take_grad(i)  # more gradient to come: accumulate in the view
                    return
            self._mark_ready(i)

    def _take_grad(self, i: int, scale: bool = False) -> None:
        """Make ``param.grad`` the bucket view again; see Note [grad views].

        With ``scale``, a large gradient is copied and scaled by ``1/world`` in one pass
        (as torch DDP's ``mul_out``) and its slot is marked so that ``_launch`` does not
        scale it again; small ones are copied (a cheaper call) and scaled with the bucket.
        """
        p, view = self.params[i], self.views[i]
        g = p.grad
        if g is view:
            return
        if g is None:
            view.zero_()
            self._was_none[i] = True
        elif scale and self._big[i] and self.comm_hook is None:
            torch.mul(g, self._inv_world, out=view)
            self._prescaled[i] = True
            self._n_prescaled[self.param_bucket[i]] += 1
        else:
            view.copy_(g)
        p.grad = view

    def _mark_ready(self, i: int) -> None:
        if self._ready[i]:
            raise ready_twice_error(self.names[i])
        self._ready[i] = True
        if self.params[i].grad is not self.views[i]:
            self._take_grad(i, scale=True)
        b = self.param_bucket[i]
        self._pending[b] -= 1
        if self._pending[b] == 0:
            self._launch_ready()

    def _launch_ready(self) -> None:
        # Note [bucket order]: strictly increasing bucket index on every rank.
        buckets, pending = self.buckets, self._pending
        while self._next < len(buckets) and pending[self._next] == 0:
            self._launch(buckets[self._next])
            self._next += 1

    def _launch(self, b: Bucket, aborted: bool = False) -> None:
        buf = b.buffer
        if self.comm_hook is None:
            # Note [divide before sum]: slots copied in by the hook were scaled on the way in
            done = self._n_prescaled[b.index]
            if done == 0:
                buf.mul_(self._inv_world)
            elif done < len(b.param_indices):
                for i in b.param_indices:
                    if not self._prescaled[i]:
                        self.views[i].mul_(self._inv_world)
        if b.index == len(self.buckets) - 1:  # Note [bucket tail]
            self._write_tail(aborted)
        self._communicate(b, buf, [self.views[i] for i in b.param_indices])

    def _write_tail(self, aborted: bool) -> None:
        tail = self.tail
        # with find_unused_parameters a late-missing gradient (e.g. an output left out of the
        # loss) is an unused parameter, not an error
        tail[0] = 0.0 if (self.find_unused or self._delay) else float(len(self._missing))
        tail[1] = 1.0 if aborted else 0.0
        if self.track_used:
            used = torch.tensor(self._local_used, dtype=tail.dtype)
            if tail.is_cuda:
                used = used.pin_memory()
            tail[TAIL_FLAGS:].copy_(used, non_blocking=True)

    def _communicate(self, b: Bucket, buf: torch.Tensor, grads: list[torch.Tensor]) -> None:
        """All-reduce ``buf`` (the bucket, or zeros of its size when joined) directly or through the hook."""
        if self.comm_hook is not None:
            part = buf[:b.numel]
            bucket = GradBucket(b.index, part, grads, [self.params[i] for i in b.param_indices],
                                b.index == len(self.buckets) - 1)
            fut = self.comm_hook(self.comm_hook_state, bucket)
            if not isinstance(fut, torch._C.Future):
                raise hook_result_error(self.comm_hook, fut)
            self._works.append((None, fut, part, None))
            return
        t = buf if self.comm_dtype is None or self.comm_dtype == buf.dtype else buf.to(self.comm_dtype)
        self._works.append((tdist.all_reduce(t, group=self.group, async_op=True), None, buf, t))

    def _wait_all(self) -> None:
        works, self._works = self._works, []
        for work, fut, buf, t in works:
            if fut is None:
                work.wait()
                if t is not buf:
                    buf.copy_(t)
            else:
                res = future_tensor(fut)
                if res.data_ptr() != buf.data_ptr() or res.shape != buf.shape:
                    buf.copy_(res)
        if self.comm_hook is not None and self.tail is not None and works:
            # Note [hook buffers]: the tail goes alone, after every hook's collectives
            tdist.all_reduce(self.tail, group=self.group)

    def _finalize(self) -> None:
        """End of backward (autograd engine callback): wait for every bucket, check, leave averaged grads."""
        with self._lock:
            self._queued = False
            if not self._expect_hooks:
                return
            self._expect_hooks = False
            if self._delay:  # static graph, first iteration: everything is reduced now
                self._static_counts = list(self._counts)
            if self._next < len(self.buckets):
                # Some parameters got no gradient here: still join every remaining all-reduce, in order, so
                # that the other ranks are not left waiting; the tail tells everyone (Note [bucket tail]).
                self._complete_step()
            self._wait_all()
            self._iteration += 1
            self._after_reduce()

    def _complete_step(self, aborted: bool = False) -> None:
        """Fill the gradients that never came (zeros) and launch every bucket not launched yet, in order."""
        unready = [i for i, r in enumerate(self._ready) if not r]
        if not self._delay and not aborted:
            self._missing = self._missing + unready
        for i in unready:
            self._take_grad(i)
            self._ready[i] = True
        for k in range(self._next, len(self.buckets)):
            self._launch(self.buckets[k], aborted=aborted)
        self._next = len(self.buckets)

    # ------------------------------------------------------------ inspection
    def plan(self) -> list[dict]:
        return [
            {"index": b.index, "dtype": b.dtype, "device": b.device, "bytes": b.nbytes, "numel": b.numel,
             "params": [self.names[i] for i in b.param_indices]}
            for b in self.buckets
        ]

