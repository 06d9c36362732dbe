"""The per-device replicas of a module and their flat gradient buffers (the ParallelExecutor's state).

Note [replica 0 is the user's module]
    Replica 0 *is* the program's module (on the first device): the user's
    optimizer steps its parameters and the user sees them. Replicas 1..n-1 are
    copies; before every run they are overwritten from replica 0 (parameters,
    buffers and train/eval flags), so they can never drift, whatever changed
    replica 0 in between (an optimizer step, ``load_state_dict``, ``.data``
    writes, batch-norm statistics of the last forward: as DDP's
    ``broadcast_buffers``, replica 0's statistics win).

Note [gradient buckets]
    The trainable parameters of replica 0 are planned into buckets with the
    engine's ``plan_buckets``; every replica owns one flat buffer per bucket
    and its ``param.grad`` are views into it (re-attached before each step,
    so ``zero_grad(set_to_none=True)`` is harmless). Each device's loss
    gradient is pre-scaled (divide before summing), the replicas' buffers
    are summed into replica 0's, and with several trainers each summed
    buffer is all-reduced across processes in bucket order. A parameter no
    replica of any trainer reached keeps ``grad=None``, as in a
    single-device step, so the optimizer skips it.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Sequence

import torch
import torch.distributed as tdist

from ..parallel.buckets import plan_buckets
from ..parallel.comm import broadcast_coalesced, verify_same_params

__all__ = ["ReplicaSet", "clone_module", "broadcast_from_rank0"]


def _state(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return list(module.named_parameters()) + list(module.named_buffers())


def clone_module(module: torch.nn.Module, device: torch.device,
                 shared: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """A deep copy of ``module`` on ``device``; tensors named in ``shared`` are reused, not copied."""
    shared = shared or {}
    memo: dict[int, object] = {}
    for name, t in _state(module):
        if name in shared:
            memo[id(t)] = shared[name]
        elif isinstance(t, torch.nn.Parameter):
            memo[id(t)] = torch.nn.Parameter(t.detach().to(device, copy=True), requires_grad=t.requires_grad)
        else:
            memo[id(t)] = t.detach().to(device, copy=True)
    try:
        return copy.deepcopy(module, memo)
    except Exception as e:
        raise TypeError(f"the ParallelExecutor copies the module once per device, but copy.deepcopy of "
                        f"{type(module).__name__} failed ({type(e).__name__}: {e}); make the module deep-copyable "
                        "(no open files, locks or generators as attributes) or use CPU_NUM=1 / one GPU") from None


@torch.no_grad()
def broadcast_from_rank0(module: torch.nn.Module) -> None:
    """Check every process holds the same parameter/buffer shapes, then copy rank 0's values everywhere."""
    named = _state(module)
    verify_same_params(named, owner="ParallelExecutor (num_trainers > 1)", what="parameter or buffer")
    broadcast_coalesced([t for _, t in named])


def _remove_hooks(handles: list) -> None:
    for h in handles:
        h.remove()
    handles.clear()


class ReplicaSet:
    """One replica of the module per device, kept identical to replica 0; see the notes above."""

    def __init__(self, module: torch.nn.Module, places: Sequence[torch.device], bucket_mb: float) -> None:
        self.places = list(places)
        self.replicas = [module] + [clone_module(module, d) for d in self.places[1:]]
        self.param_ids = tuple(id(p) for p in module.parameters())
        self._states = [[t for _, t in _state(r)] for r in self.replicas]
        self._modules = [list(r.modules()) for r in self.replicas]
        self.params = [[p for p in r.parameters() if p.requires_grad] for r in self.replicas]
        self.buckets = plan_buckets(self.params[0], bucket_mb, bucket_mb) if self.params[0] else []
        self._buffers: list[list[torch.Tensor]] | None = None
        self.used = [bytearray(len(self.params[0])) for _ in self.replicas]
        self._hooks = []
        for k, ps in enumerate(self.params):
            for i, p in enumerate(ps):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._marker(self.used[k], i)))
        # an executor dropped without drop_local_exe_scopes() must not leave hooks on the user's parameters
        weakref.finalize(self, _remove_hooks, self._hooks)

    @staticmethod
    def _marker(flags: bytearray, i: int):
        def mark(_p: torch.Tensor) -> None:
            flags[i] = 1
        return mark

    def is_current(self, module: torch.nn.Module) -> bool:
        """False when the module's parameter objects changed since this set was built."""
        return tuple(id(p) for p in module.parameters()) == self.param_ids

    @torch.no_grad()
    def sync(self, training_flags: Sequence[bool] | None = None) -> None:
        """Copy replica 0's parameters, buffers and train/eval flags into every other replica."""
        src = self._states[0]
        flags = training_flags if training_flags is not None else [m.training for m in self._modules[0]]
        for k in range(1, len(self.replicas)):
            dst = self._states[k]
            if dst and self.places[k] == self.places[0]:
                torch._foreach_copy_(dst, src)
            else:
                for d, s in zip(dst, src):
                    d.copy_(s, non_blocking=True)
        for mods in self._modules:
            for m, f in zip(mods, flags):
                m.training = f

    def prepare_grads(self) -> None:
        """Zero the flat buffers and point every trainable parameter's ``.grad`` into them."""
        if self._buffers is None:
            self._buffers = [[torch.zeros(b.numel, dtype=b.dtype, device=self.places[k]) for b in self.buckets]
                             for k in range(len(self.replicas))]
        for k, ps in enumerate(self.params):
            self.used[k][:] = bytes(len(ps))
            for b, buf in zip(self.buckets, self._buffers[k]):
                buf.zero_()
                for i, off in zip(b.param_indices, b.offsets):
                    p = ps[i]
                    p.grad = buf[off:off + p.numel()].view_as(p)

    @torch.no_grad()
    def reduce(self, distributed: bool) -> None:
        """Sum the replicas' (pre-scaled) gradients into replica 0, across processes too when ``distributed``."""
        assert self._buffers is not None, "prepare_grads() must run before reduce()"
        totals = self._buffers[0]
        for k in range(1, len(self.replicas)):
            for acc, buf in zip(totals, self._buffers[k]):
                acc.add_(buf if buf.device == acc.device else buf.to(acc.device, non_blocking=True))
        n = len(self.params[0])
        used = torch.zeros(n, dtype=torch.int32)
        for flags in self.used:
            used += torch.tensor(list(flags), dtype=torch.int32)
        if distributed:
            works = [tdist.all_reduce(acc, async_op=True) for acc in totals]  # Note [bucket order]
            used = used.to(self.places[0])
            tdist.all_reduce(used)
            for w in works:
                w.wait()
            used = used.cpu()
        for p, u in zip(self.params[0], used.tolist()):
            if not u:
                p.grad = None

    def free(self) -> None:
        """Drop the copies, buffers and hooks (replica 0, the user's module, and its grads stay)."""
        _remove_hooks(self._hooks)
        self.replicas = self.replicas[:1]
        self._states = self._states[:1]
        self._modules = self._modules[:1]
        self.params = self.params[:1]
        self._buffers = None
