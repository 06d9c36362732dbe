"""The gradient reducer: flat bucket buffers, per-parameter hooks, in-order async all-reduce.

Note [grad views]
    Each bucket is one flat buffer and ``param.grad`` is a view into it, so a
    gradient is stored once and needs no copy before the all-reduce. When a
    user sets grads to ``None`` (``zero_grad(set_to_none=True)``), autograd
    hands the next gradient over as a fresh tensor; the hook copies it into
    the bucket slot and points ``param.grad`` back at the view.

Note [divide before sum]
    A bucket is scaled by ``1/world`` before the all-reduce (as torch DDP
    does), so fp16 sums cannot overflow where the mean would not, and the
    result is the mean with DDP's exact rounding.

Note [bucket tail]
    The bucket reduced last carries a few extra elements after the
    gradients: slot 0 counts parameters that got no gradient on some rank
    (an error without ``find_unused_parameters``), then one "used" slot per
    parameter when ``find_unused_parameters`` is on. Riding on the last
    all-reduce, every rank learns of a missing gradient anywhere at no extra
    collective, and all ranks raise the same error instead of hanging.

See also Note [bucket order] and Note [last bucket] in buckets.py.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

from .buckets import Bucket, module_units, plan_buckets

__all__ = ["Reducer"]

_FUSED_SCALE_NUMEL = 1 << 18

_RECOMPUTE_HINT = (
    "This happens when a PyLayer / reentrant checkpoint calls backward inside backward, or when backward runs "
    "twice for one forward. Run such steps under `model.no_sync()` and call "
    "`fused_allreduce_gradients(list(model.parameters()), None)` before the optimizer step, or use "
    "torch.utils.checkpoint(..., use_reentrant=False)."
)


class Reducer:
    """Averages the gradients of ``params`` across ``group`` during backward."""

    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]], group, world_size: int,
                 comm_buffer_size: float, last_comm_buffer_size: float, find_unused_parameters: bool,
                 comm_dtype: torch.dtype | None = None):
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.group = group
        self.world = world_size
        self.find_unused = find_unused_parameters
        self.comm_dtype = comm_dtype
        self.buckets: list[Bucket] = plan_buckets(self.params, comm_buffer_size, last_comm_buffer_size,
                                                  units=module_units(self.names))
        n = len(self.params)
        self.param_bucket = [0] * n
        self.views: list[torch.Tensor | None] = [None] * n
        self.tail: torch.Tensor | None = None
        self._hooks = []
        if world_size > 1 and n:
            self._allocate()
            self._register_hooks()
        self._expect_hooks = False
        self._queued = False
        self._inv_world = 1.0 / world_size
        # per-call overhead dominates below this size: copy, then scale the whole bucket at once
        self._big = [p.numel() >= _FUSED_SCALE_NUMEL for p in self.params]

    # ------------------------------------------------------------------ setup
    def _allocate(self) -> None:
        tail_len = 1 + (len(self.params) if self.find_unused else 0)
        last = len(self.buckets) - 1
        for b in self.buckets:
            extra = tail_len if b.index == last else 0
            b.buffer = torch.zeros(b.numel + extra, dtype=b.dtype, device=b.device)
            for i, off in zip(b.param_indices, b.offsets):
                p = self.params[i]
                self.param_bucket[i] = b.index
                view = b.buffer[off:off + p.numel()].view_as(p)
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
            if self._expect_hooks:
                self._mark_ready(i)

        return hook

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

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
        n = len(self.params)
        self._ready = [False] * n
        self._used = [True] * n
        self._pending = [len(b.param_indices) for b in self.buckets]
        self._next = 0
        self._works: list = []
        self._missing: list[int] = []
        self._was_none = [False] * n
        self._prescaled = [False] * n
        self._n_prescaled = [0] * len(self.buckets)
        self._expect_hooks = True
        self._queued = False
        if self.find_unused:
            reached = _reachable_params(outputs)
            for i, p in enumerate(self.params):
                if p not in reached:
                    self._used[i] = False
                    self._take_grad(i)
                    self._ready[i] = True
                    self._pending[self.param_bucket[i]] -= 1

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
        elif scale and self._big[i]:
            torch.mul(g, self._inv_world, out=view)
            self._prescaled[i] = True
            self._n_prescaled[self.param_bucket[i]] += 1
        else:
            view.copy_(g)
        p.grad = view

    def _mark_ready(self, i: int) -> None:
        if self._ready[i]:
            raise RuntimeError(
                f"DataParallel: parameter {self.names[i]!r} received a gradient after it was already marked "
                f"ready in this backward pass (its bucket may already be reduced). {_RECOMPUTE_HINT}"
            )
        self._ready[i] = True
        if self.params[i].grad is not self.views[i]:
            self._take_grad(i, scale=True)
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
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

    def _launch(self, b: Bucket) -> None:
        buf = b.buffer
        # Note [divide before sum]: slots copied in by the hook were scaled on the way in
        done = self._n_prescaled[b.index]
        if done == 0:
            buf.mul_(self._inv_world)
        elif done < len(b.param_indices):
            for i in b.param_indices:
                if not self._prescaled[i]:
                    self.views[i].mul_(self._inv_world)
        if b.index == len(self.buckets) - 1:  # Note [bucket tail]
            tail = self.tail
            # with find_unused_parameters a late-missing gradient (e.g. an output left out of the
            # loss) is an unused parameter, not an error
            tail[0] = 0.0 if self.find_unused else float(len(self._missing))
            if self.find_unused:
                tail[1:] = torch.tensor(self._used, dtype=tail.dtype, device=tail.device)
        t = buf if self.comm_dtype is None or self.comm_dtype == buf.dtype else buf.to(self.comm_dtype)
        self._works.append((tdist.all_reduce(t, group=self.group, async_op=True), buf, t))

    def _finalize(self) -> None:
        """End of backward (autograd engine callback): wait for every bucket, check, leave averaged grads."""
        self._expect_hooks = False
        self._queued = False
        if self._next < len(self.buckets):
            # Some parameters got no gradient here: still join every remaining all-reduce, in order, so
            # that the other ranks are not left waiting; the tail tells everyone (Note [bucket tail]).
            self._missing = [i for i, r in enumerate(self._ready) if not r]
            for i in self._missing:
                self._take_grad(i)
                self._used[i] = False
            for k in range(self._next, len(self.buckets)):
                self._launch(self.buckets[k])
            self._next = len(self.buckets)
        for work, buf, t in self._works:
            work.wait()
            if t is not buf:
                buf.copy_(t)
        self._works = []
        if self.tail is not None and float(self.tail[0]) > 0.0:
            self._raise_missing()
        if self.find_unused:
            used = self.tail[1:].tolist()
            for i, u in enumerate(used):
                if u == 0.0 and self._was_none[i]:
                    self.params[i].grad = None  # unused on every rank: leave it as torch DDP does

    def _raise_missing(self) -> None:
        names = [self.names[i] for i in self._missing]
        everyone: list = [None] * self.world
        tdist.all_gather_object(everyone, names, group=self.group)
        detail = "; ".join(f"rank {r}: {', '.join(ns[:10])}{' ...' if len(ns) > 10 else ''}"
                           for r, ns in enumerate(everyone) if ns)
        raise RuntimeError(
            "DataParallel: some parameters received no gradient in this backward pass, so their all-reduce "
            f"could not be matched across ranks ({detail}). If parts of the model are legitimately unused in "
            "some steps, wrap it with DataParallel(model, find_unused_parameters=True); if they are never "
            "used, remove them or set requires_grad=False."
        )

    # ------------------------------------------------------------ inspection
    def plan(self) -> list[dict]:
        return [
            {"index": b.index, "dtype": b.dtype, "device": b.device, "bytes": b.nbytes, "numel": b.numel,
             "params": [self.names[i] for i in b.param_indices]}
            for b in self.buckets
        ]


def _reachable_params(outputs) -> set:
    """Parameters reached by walking the autograd graph back from ``outputs``."""
    roots = []
    stack = [outputs]
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            if o.grad_fn is not None:
                roots.append(o.grad_fn)
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif hasattr(o, "__dataclass_fields__"):
            stack.extend(getattr(o, f) for f in o.__dataclass_fields__)
    seen = set()
    reached = set()
    while roots:
        fn = roots.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None:
            reached.add(var)
        roots.extend(nf for nf, _ in fn.next_functions)
    return reached
