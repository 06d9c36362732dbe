"""``fleetlite.DataParallel``: Paddle's DataParallel on our own bucketed all-reduce engine."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from .comm import broadcast_coalesced, group_size, verify_same_params
from .reducer import Reducer

__all__ = ["DataParallel"]

_PREFIXES = ("module.", "_layers.")
_BROADCAST_CHUNK = 16 * 1024 * 1024


def _strip_prefix(state_dict: Mapping[str, object]) -> Mapping[str, object]:
    """Drop a ``module.`` (torch DDP) or ``_layers.`` prefix carried by every key."""
    keys = list(state_dict)
    for prefix in _PREFIXES:
        if keys and all(k.startswith(prefix) for k in keys):
            return OrderedDict((k[len(prefix):], v) for k, v in state_dict.items())
    return state_dict


def _unprefixed_keys_pre_hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                               error_msgs) -> None:
    """Map ``prefix + k`` (or ``prefix + "module." + k``) to ``prefix + "_layers." + k`` in place."""
    inner = prefix + "_layers."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        rest = key[len(prefix):]
        if rest.startswith("module."):
            rest = rest[len("module."):]
        state_dict[inner + rest] = state_dict.pop(key)


class DataParallel(nn.Module):
    """Data-parallel wrapper: gradients are averaged across ranks during backward.

    Parameters that require grad are grouped (reverse registration order, per
    dtype and device) into flat buckets of at most ``comm_buffer_size`` MB;
    the bucket reduced last is capped at ``last_comm_buffer_size`` MB.
    ``param.grad`` is a view into its bucket, and each bucket's all-reduce
    starts as soon as its gradients are final, overlapping the rest of
    backward. With world size 1 the wrapper is a transparent pass-through.

    Args:
        layers: the model.
        strategy: accepted for Paddle compatibility; a ``DistributedStrategy``
            supplies defaults through :func:`fleet.distributed_model` instead.
        comm_buffer_size: bucket size in MB (float allowed).
        last_comm_buffer_size: size of the last-reduced bucket in MB.
        find_unused_parameters: allow parameters that get no gradient in a step
            (they are reduced as zeros); costs a graph walk per forward.
        group: the process group (default: the world).
        broadcast_buffers: make buffers (e.g. BatchNorm statistics) follow rank
            0 at each training forward, as torch DDP does.
        comm_dtype: all-reduce buckets in this dtype (``torch.float16`` or
            ``torch.bfloat16``) and cast back; ``None`` keeps the gradient dtype.

    Example::

        import torch, fleetlite, fleetlite.distributed as dist
        dist.init_parallel_env()
        model = fleetlite.DataParallel(torch.nn.Linear(10, 1))
        model(torch.randn(4, 10)).sum().backward()   # grads averaged over ranks
    """

    def __init__(self, layers: nn.Module, strategy=None, comm_buffer_size: float = 25,
                 last_comm_buffer_size: float = 1, find_unused_parameters: bool = False, group=None,
                 broadcast_buffers: bool = True, comm_dtype: torch.dtype | None = None):
        super().__init__()
        if not isinstance(layers, nn.Module):
            raise TypeError(f"DataParallel wraps an nn.Module, got {type(layers).__name__}")
        if isinstance(layers, DataParallel):
            raise TypeError("the model is already wrapped in DataParallel; wrap the plain module once")
        if comm_dtype not in (None, torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"comm_dtype={comm_dtype!r} must be None (the gradients' dtype), torch.float16, "
                             "torch.bfloat16 or torch.float32")
        if strategy is not None and hasattr(strategy, "fuse_grad_size_in_MB"):
            warnings.warn("DataParallel(strategy=DistributedStrategy) does not apply the strategy; use "
                          "fleet.init(strategy=...) and fleet.distributed_model(model), which configure "
                          "DataParallel from it", stacklevel=2)
        self._layers = layers
        self._strategy = strategy
        self.group = group
        self.find_unused_parameters = bool(find_unused_parameters)
        self.broadcast_buffers = bool(broadcast_buffers)
        self.comm_buffer_size = comm_buffer_size
        self.last_comm_buffer_size = last_comm_buffer_size
        self.require_backward_grad_sync = True
        self.world_size = group_size(group)
        named = [(n, p) for n, p in layers.named_parameters() if p.requires_grad]
        if self.world_size > 1:
            verify_same_params(named, group)
            # in chunks of 16 MB: a flat copy of the whole model would double its memory for a moment
            broadcast_coalesced([p.data for p in layers.parameters()] + [b for b in layers.buffers()], group,
                                cap_bytes=_BROADCAST_CHUNK)
        self._reducer = Reducer(named, group, self.world_size, comm_buffer_size, last_comm_buffer_size,
                                self.find_unused_parameters, comm_dtype)
        # inside a parent module, the parent's state_dict holds our module's own keys (see state_dict)
        self._register_load_state_dict_pre_hook(_unprefixed_keys_pre_hook)

    # ------------------------------------------------------------------ access
    @property
    def module(self) -> nn.Module:
        """The wrapped model."""
        return self._layers

    @property
    def bucket_plan(self) -> list[dict]:
        """Per bucket, in reduction order: ``index``, ``dtype``, ``device``, ``bytes``, ``numel``, ``params``."""
        return self._reducer.plan()

    # ------------------------------------------------------------------ forward
    def forward(self, *inputs, **kwargs):
        if self.world_size == 1:
            return self._layers(*inputs, **kwargs)
        if self.broadcast_buffers and self._layers.training:
            buffers = [b for b in self._layers.buffers()]
            if buffers:
                broadcast_coalesced(buffers, self.group)
        out = self._layers(*inputs, **kwargs)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._reducer.prepare_for_backward(out)
        else:
            self._reducer._expect_hooks = False
        return out

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the next synced backward reduces the accumulated sum.

        Example::

            with model.no_sync():
                model(x1).sum().backward()   # local only
            model(x2).sum().backward()       # averages x1 + x2 gradients across ranks
        """
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # ---------------------------------------------------------------- state
    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """The wrapped module's state dict, with its own keys (no ``_layers.``/``module.`` prefix)."""
        return self._layers.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)

    def load_state_dict(self, state_dict: Mapping[str, object], strict: bool = True, assign: bool = False):
        """Load plain keys, or keys prefixed by torch DDP's ``module.`` (or ``_layers.``)."""
        return self._layers.load_state_dict(_strip_prefix(state_dict), strict=strict, assign=assign)

    def set_state_dict(self, state_dict: Mapping[str, object], use_structured_name: bool = True):
        """Paddle's name for :meth:`load_state_dict`."""
        return self.load_state_dict(state_dict)

    set_dict = set_state_dict

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            layers = self._modules.get("_layers")
            if layers is not None and name not in ("_reducer",) and hasattr(layers, name):
                return getattr(layers, name)
            raise
