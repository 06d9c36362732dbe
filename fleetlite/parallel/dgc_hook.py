"""Deep Gradient Compression (Lin et al., 2018) as a communication hook on the engine's buckets.

torch has no DGC hook; this one follows Paddle's ``dgc`` kernel and the
paper's algorithm 1. Register it with ``model.register_comm_hook(state, dgc_hook)``
on a :class:`fleetlite.DataParallel` (or torch DDP) and step with an optimizer
that knows which gradients already carry momentum
(:class:`fleetlite.distributed.fleet.meta_optimizers.DGCMomentum`, which
``strategy.dgc`` sets up).

Note [DGC step]
    Steps count from 0 (one per synchronised backward, counted on the last
    bucket). Before ``rampup_begin_step`` the hook is a dense all-reduce
    (gradients divided by the world size, then summed: the engine's own
    arithmetic, so training is identical to dense data parallel). From then
    on, for each parameter that is compressed (float32 with at least
    ``min_numel`` elements, Paddle's 16384; the others stay dense) with local
    gradient ``g`` (the gradient of this rank's mean loss)::

        g = clip_by_norm(g, local_grad_clip_norm * sqrt(world))   # local clipping, when set
        g = g + l2 * w                                            # the optimizer's weight decay, if any
        u = m * u + g                                             # momentum correction
        v = v + u                                                 # local accumulation
        idx = top-k of |v|, k = int(numel * (1 - sparsity))       # sparsification
        send (v[idx], idx);  v[idx] = 0;  u[idx] = 0              # momentum factor masking

    ``sparsity`` is ``sparsity[int((step - rampup_begin_step) * len(sparsity) / rampup_step)]``,
    the last entry once past the end (Paddle's ``get_period_sparcity``).
    Clipping: Paddle's local gradient is ours divided by the world size N
    (its loss is divided by N) and is clipped to ``clip_norm / sqrt(N)``
    (the paper's N^-1/2 rule), which is ours clipped to ``clip_norm * sqrt(N)``;
    the decay term is added after clipping, as Paddle's kernel does. One
    ``all_gather`` per bucket carries, from every rank, the dense gradients of
    the uncompressed parameters and the selected values with their indices
    (int32 bit patterns in the float buffer); the result is the sum over the
    ranks divided by the world size. The compressed gradients already hold
    the momentum, so the optimizer applies them as plain SGD
    (``w -= lr * grad``) and keeps torch's momentum for the dense ones.

Bytes: :attr:`DGCState.bytes_per_step` records, per step, the bytes this rank
hands to the collectives (the all-reduced buffer before ``rampup_begin_step``,
the all-gathered one after).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as tdist

__all__ = ["DGCState", "dgc_hook", "DEFAULT_SPARSITY", "MIN_NUMEL"]

DEFAULT_SPARSITY = (0.999,)  # Paddle's DGCMomentumOptimizer default
MIN_NUMEL = 16384  # Paddle compresses only parameters with at least this many elements


class DGCState:
    """What :func:`dgc_hook` keeps between steps: the step count, the ``u``/``v`` accumulators, bytes sent.

    Example::

        state = DGCState(momentum=0.9, rampup_begin_step=100, rampup_step=50, sparsity=[0.75, 0.9375, 0.999])
        model.register_comm_hook(state, dgc_hook)
    """

    def __init__(self, momentum: float, rampup_begin_step: int = 0, rampup_step: int = 1,
                 sparsity: list[float] | tuple[float, ...] = (), local_grad_clip_norm: float | None = None,
                 min_numel: int = MIN_NUMEL, process_group=None) -> None:
        sparsity = tuple(float(s) for s in sparsity) or DEFAULT_SPARSITY
        if not all(0 <= s < 1 for s in sparsity):
            raise ValueError(f"DGC sparsity values must be in [0, 1), got {list(sparsity)}")
        if rampup_step < 1 or rampup_begin_step < 0:
            raise ValueError(f"DGC needs rampup_step >= 1 and rampup_begin_step >= 0, got {rampup_step}, "
                             f"{rampup_begin_step}")
        self.momentum, self.rampup_begin_step, self.rampup_step = float(momentum), int(rampup_begin_step), int(
            rampup_step)
        self.sparsity, self.local_grad_clip_norm, self.min_numel = sparsity, local_grad_clip_norm, int(min_numel)
        self.process_group = process_group
        self.l2: dict[int, float] = {}  # id(param) -> L2 coefficient added to its local gradient (weight decay)
        self.iter = 0
        self.compressed_step = False  # whether the last completed backward was compressed
        self.bytes_per_step: list[int] = []
        self._bytes = 0
        self._u: dict[int, torch.Tensor] = {}
        self._v: dict[int, torch.Tensor] = {}

    def compresses(self, param: torch.Tensor) -> bool:
        """Whether ``param``'s gradient is compressed (after ``rampup_begin_step``)."""
        return param.dtype == torch.float32 and param.numel() >= self.min_numel

    def current_sparsity(self) -> float:
        idx = int((self.iter - self.rampup_begin_step) * len(self.sparsity) / self.rampup_step)
        return self.sparsity[min(idx, len(self.sparsity) - 1)]

    def state_dict(self) -> dict:
        return {"iter": self.iter, "u": dict(self._u), "v": dict(self._v)}

    def _end_bucket(self, bucket, compressed: bool, nbytes: int) -> None:
        self._bytes += nbytes
        if bucket.is_last():
            self.bytes_per_step.append(self._bytes)
            self._bytes = 0
            self.compressed_step = compressed
            self.iter += 1


def _dense(state: DGCState, bucket) -> torch.futures.Future:
    buf = bucket.buffer()
    group = state.process_group if state.process_group is not None else tdist.group.WORLD
    buf.mul_(1.0 / tdist.get_world_size(group))  # Note [divide before sum], as the engine does without a hook
    state._end_bucket(bucket, False, buf.numel() * buf.element_size())
    return tdist.all_reduce(buf, group=group, async_op=True).get_future().then(lambda _: buf)


def dgc_hook(state: DGCState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Dense all-reduce before ``rampup_begin_step``, then DGC (Note [DGC step]); resolves to the averaged bucket."""
    if state.iter < state.rampup_begin_step:
        return _dense(state, bucket)
    group = state.process_group if state.process_group is not None else tdist.group.WORLD
    world = tdist.get_world_size(group)
    buf = bucket.buffer()
    sparsity = state.current_sparsity()
    dense_parts, values, indices = [], [], []
    offset = 0
    with torch.no_grad():
        for p, g in zip(bucket.parameters(), bucket.gradients()):
            n = g.numel()
            flat = buf[offset:offset + n]
            if not state.compresses(p):
                dense_parts.append((offset, n))
                offset += n
                continue
            grad = flat.clone()
            if state.local_grad_clip_norm is not None:
                limit = state.local_grad_clip_norm * math.sqrt(world)  # Note [DGC step]: Paddle's clip, our scale
                norm = float(torch.linalg.vector_norm(grad))
                if norm > limit:
                    grad.mul_(limit / norm)
            coeff = state.l2.get(id(p), 0.0)
            if coeff:
                grad.add_(p.detach().reshape(-1), alpha=coeff)
            key = id(p)
            if key not in state._u:
                state._u[key], state._v[key] = torch.zeros_like(grad), torch.zeros_like(grad)
            u, v = state._u[key], state._v[key]
            u.mul_(state.momentum).add_(grad)
            v.add_(u)
            k = max(1, int(n * (1 - sparsity)))
            idx = torch.topk(v.abs(), k, sorted=False).indices
            values.append(v[idx])
            indices.append((idx + offset).to(torch.int32))
            v[idx] = 0
            u[idx] = 0
            offset += n
        dense = torch.cat([buf[o:o + n] for o, n in dense_parts]) if dense_parts else buf.new_empty(0)
        vals = torch.cat(values) if values else buf.new_empty(0)
        idx_bits = torch.cat(indices).view(torch.float32) if indices else buf.new_empty(0)
        send = torch.cat([dense, vals, idx_bits])
    gathered = [torch.empty_like(send) for _ in range(world)]
    state._end_bucket(bucket, True, send.numel() * send.element_size())
    n_dense, n_vals = dense.numel(), vals.numel()

    def decode(_fut) -> torch.Tensor:
        out = torch.zeros_like(buf)
        for part in gathered:
            pos = 0
            for o, n in dense_parts:
                out[o:o + n] += part[pos:pos + n]
                pos += n
            out.index_add_(0, part[n_dense + n_vals:].view(torch.int32).long(), part[n_dense:n_dense + n_vals])
        out.mul_(1.0 / world)
        return out

    return tdist.all_gather(gathered, send, group=group, async_op=True).get_future().then(decode)
