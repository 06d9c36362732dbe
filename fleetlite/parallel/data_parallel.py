"""The engine's wrapper: :class:`DataParallelBase`, shared by the two faces in :mod:`fleetlite.parallel.faces`.

Everything both faces do lives here (construction sync, the forward, the
reducer, join, comm hooks, state dicts); a face only chooses its constructor
signature and its reducer class (``_reducer_cls``). See the table in
``faces.py`` for what differs and why.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.utils._pytree import tree_map

from .comm import broadcast_coalesced, group_size, verify_same_params
from .comm_hooks import check_comm_hook
from .ddp_args import resolve
from .join import DataParallelJoinHook, announce_step
from .reducer import Reducer
from .wrapped import WrappedModel

__all__ = ["DataParallelBase"]

_PREFIXES = ("module.", "_layers.")
_BROADCAST_CHUNK = 16 * 1024 * 1024


@contextmanager
def sync_off(model) -> Iterator[None]:
    """``model.require_backward_grad_sync`` off for the block, restored after: what every ``no_sync()`` does."""
    old = model.require_backward_grad_sync
    model.require_backward_grad_sync = False
    try:
        yield
    finally:
        model.require_backward_grad_sync = old


def _strip_prefix(state_dict: Mapping[str, object]) -> Mapping[str, object]:
    """Drop a ``module.`` (torch DDP) or ``_layers.`` prefix carried by every key."""
    keys = list(state_dict)
    for prefix in _PREFIXES:
        if keys and all(k.startswith(prefix) for k in keys):
            return OrderedDict((k[len(prefix):], v) for k, v in state_dict.items())
    return state_dict


def _unprefixed_keys_pre_hook(name: str, state_dict, prefix, local_metadata, strict, missing_keys,
                               unexpected_keys, error_msgs) -> None:
    """Map ``prefix + k`` (or ``prefix + "module." + k`` / ``"_layers." + k``) to ``prefix + name + "." + k`` in
    place, ``name`` the wrapped module's attribute (``_layers`` or ``module``)."""
    inner = prefix + name + "."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        rest = key[len(prefix):]
        for other in _PREFIXES:
            if rest.startswith(other):
                rest = rest[len(other):]
                break
        state_dict[inner + rest] = state_dict.pop(key)


class DataParallelBase(WrappedModel, Joinable):
    """Data-parallel wrapper: gradients are averaged across ranks during backward (the engine under both faces).

    Not used directly: :class:`fleetlite.DataParallel` (Paddle's face) and
    :class:`fleetlite.DistributedDataParallel` (torch DDP's face) are thin
    subclasses; their docstrings list the arguments. Parameters that require
    grad are grouped (reverse registration order, per dtype and device) into
    flat buckets of at most ``comm_buffer_size`` MB; the bucket reduced last is
    capped at ``last_comm_buffer_size`` MB. ``param.grad`` is always a view into
    its bucket, with the parameter's strides (DDP's
    ``gradient_as_bucket_view=True``), and each bucket's all-reduce starts as
    soon as its gradients are final, overlapping the rest of backward. With
    world size 1 the wrapper is a transparent pass-through.

    Example::

        import torch, fleetlite, fleetlite.distributed as dist
        dist.init_parallel_env()
        model = fleetlite.DataParallel(torch.nn.Linear(10, 1))
        model(torch.randn(4, 10)).sum().backward()   # grads averaged over ranks
    """

    def __init__(self, layers: nn.Module | None = None, strategy=None, comm_buffer_size: float | None = None,
                 last_comm_buffer_size: float | None = None, find_unused_parameters: bool = False, group=None,
                 broadcast_buffers: bool | None = None, comm_dtype: torch.dtype | None = None, *,
                 module: nn.Module | None = None, device_ids=None, output_device=None, dim: int = 0,
                 process_group=None, bucket_cap_mb: float | None = None, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False, init_sync: bool = True,
                 device_mesh=None, forward_sync_buffers: bool | None = None, batched_grad_copy: bool = False,
                 **ddp_kwargs):
        super().__init__()
        Joinable.__init__(self)
        if isinstance(strategy, (list, tuple)):  # DDP(model, [local_rank])
            if device_ids is not None:
                raise ValueError("DataParallel got device_ids twice (positionally and by keyword)")
            strategy, device_ids = None, strategy
        if isinstance(layers, DataParallelBase) or isinstance(module, DataParallelBase):
            raise TypeError("the model is already wrapped in DataParallel; wrap the plain module once")
        cfg = resolve(layers, module, group, process_group, device_mesh, comm_buffer_size, bucket_cap_mb,
                      last_comm_buffer_size, device_ids, output_device, dim, broadcast_buffers,
                      forward_sync_buffers, ddp_kwargs)
        if comm_dtype not in (None, torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"comm_dtype={comm_dtype!r} must be None (the gradients' dtype), torch.float16, "
                             "torch.bfloat16 or torch.float32")
        if strategy is not None and hasattr(strategy, "fuse_grad_size_in_MB"):
            warnings.warn("DataParallel(strategy=DistributedStrategy) does not apply the strategy; use "
                          "fleet.init(strategy=...) and fleet.distributed_model(model), which configure "
                          "DataParallel from it", stacklevel=2)
        layers = cfg.module
        # registered under the face's name: named_parameters() gives "_layers.w" (Paddle) / "module.w" (DDP);
        # straight into _modules, as add_module would, because `module` is also this class's property
        self._modules[self._module_attr] = layers
        self.device_mesh = device_mesh
        self._strategy = strategy
        self.group = cfg.group
        self.find_unused_parameters = bool(find_unused_parameters)
        self._forward_sync_buffers = cfg.forward_sync_buffers
        self.comm_buffer_size = cfg.comm_buffer_size
        self.last_comm_buffer_size = cfg.last_comm_buffer_size
        self.comm_dtype = comm_dtype
        self.device_ids, self.output_device, self.dim = cfg.device_ids, cfg.output_device, dim
        self.check_reduction = check_reduction
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.static_graph = bool(static_graph)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._divide_by_initial_world_size = True
        ignored = set(getattr(layers, "_ddp_params_and_buffers_to_ignore", ()))
        self._ignored = ignored
        named = [(n, p) for n, p in layers.named_parameters() if p.requires_grad and n not in ignored]
        if not named:
            raise RuntimeError(
                "DataParallel is not needed when a module doesn't have any parameter that requires a gradient "
                f"({type(layers).__name__} has none to average). Run it without the wrapper, or unfreeze the "
                "parameters to train (requires_grad=True) before wrapping.")
        sparse = [n for n, mod in layers.named_modules() if getattr(mod, "sparse", False) is True
                  and isinstance(mod, (nn.Embedding, nn.EmbeddingBag))]
        if sparse:
            raise ValueError(f"DataParallel averages dense gradients only, but {sparse[0]!r} is an embedding with "
                             "sparse=True (sparse gradients). Build it with sparse=False, or use torch DDP for "
                             "sparse gradients")
        if len({p.device.type for _, p in named}) != 1:
            raise ValueError("DataParallel's input module must be on the same type of devices, but its parameters "
                             f"are on {sorted({str(p.device) for _, p in named})}")
        self.device = named[0][1].device
        self.world_size = group_size(self.group)
        if self.world_size > 1 and init_sync:
            verify_same_params(named, self.group)
            # in chunks of 16 MB: a flat copy of the whole model would double its memory for a moment
            tensors = [p.data for p in self._params_to_sync()]
            if cfg.init_sync_buffers:
                tensors += self._sync_buffers_list()
            broadcast_coalesced(tensors, self.group, cap_bytes=_BROADCAST_CHUNK)
        self._build_reducer()
        # inside a parent module, the parent's state_dict holds our module's own keys (see state_dict)
        self._register_load_state_dict_pre_hook(partial(_unprefixed_keys_pre_hook, self._module_attr))

    _reducer_cls: type[Reducer] = Reducer  # a face picks its reducer (faces.py); nothing tests which one
    _module_attr = "_layers"  # a face picks the wrapped module's name (faces.py): the prefix of every name

    @property
    def _layers(self) -> nn.Module:
        return self._modules[self._module_attr]

    def _build_reducer(self) -> None:
        named = [(n, p) for n, p in self._layers.named_parameters() if p.requires_grad and n not in self._ignored]
        owner, _, attr = named[0][0].rpartition(".")
        # Note [functional_call]: where the first parameter lives, to see it swapped out
        self._first_slot = (self._layers.get_submodule(owner), attr, named[0][1])
        self._reducer = self._reducer_cls(named, self.group, self.world_size, self.comm_buffer_size,
                                self.last_comm_buffer_size, self.find_unused_parameters, self.comm_dtype,
                                static_graph=self.static_graph)

    def _params_to_sync(self) -> list[torch.Tensor]:
        return [p for n, p in self._layers.named_parameters() if n not in self._ignored]

    def _sync_buffers_list(self) -> list[torch.Tensor]:
        return [b for n, b in self._layers.named_buffers() if n not in self._ignored]

    @property
    def broadcast_buffers(self) -> bool:
        """Whether buffers follow the authoritative rank at each training forward."""
        return self._forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self._forward_sync_buffers = bool(value)

    @property
    def process_group(self):
        """torch DDP's name for :attr:`group` (``None``: the default group)."""
        return self.group

    # ------------------------------------------------------------------ access
    @property
    def module(self) -> nn.Module:
        """The wrapped model."""
        return self._modules[self._module_attr]

    @property
    def bucket_plan(self) -> list[dict]:
        """Per bucket, in reduction order: ``index``, ``dtype``, ``device``, ``bytes``, ``numel``, ``params``."""
        return self._reducer.plan()

    # ------------------------------------------------------------------ forward
    def will_sync_module_buffers(self) -> bool:
        """Whether this forward broadcasts the buffers from the authoritative rank (torch DDP's rule).

        Note [buffer sync]
            As torch DDP (``_check_sync_bufs_pre_fwd``): a forward broadcasts the
            buffers when ``forward_sync_buffers`` is on and the *previous* forward
            was one whose backward is synced (grad enabled, not under ``no_sync``);
            that forward sets ``require_forward_param_sync``. Training or eval mode
            does not matter: the first forward after a synced training step, an
            eval-mode validation forward included, sees rank 0's statistics, and
            under ``no_sync`` only the window's first forward broadcasts.
        """
        return self.require_forward_param_sync and self._forward_sync_buffers

    def forward(self, *inputs, **kwargs):
        if self.device_ids:  # as torch DDP: inputs follow the module to its device
            dev = torch.device("cuda", self.device_ids[0])
            inputs, kwargs = tree_map(lambda t: t.to(dev, non_blocking=True) if isinstance(t, torch.Tensor)
                                      else t, (inputs, kwargs))
        if self.world_size == 1:
            return self._layers(*inputs, **kwargs)
        reducer = self._reducer
        if reducer._expect_hooks and torch._C._current_graph_task_id() != -1:
            # a non-reentrant checkpoint recomputing this forward inside the backward it belongs to:
            # the step is already armed (as torch DDP, buffers are broadcast again, nothing else)
            if self.will_sync_module_buffers():
                broadcast_coalesced(self._sync_buffers_list(), self.group)
            return self._layers(*inputs, **kwargs)
        reducer.check_lag = 0 if self._join_config.enable else 1  # Note [bucket tail] in reducer.py
        reducer.resume_if_interrupted()  # Note [interrupted backward] in reducer.py
        sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        buffers = self.will_sync_module_buffers()  # Note [buffer sync]
        src, divisor = 0, self.world_size
        if self._join_config.enable:  # Note [join collectives]
            work = Join.notify_join_context(self)
            _, buffers, src = announce_step(self, sync, buffers)
            if sync and work is not None and not self._divide_by_initial_world_size:
                work.wait()
                divisor = int(work.result()[0].item())  # ranks not joined yet
        if sync:
            reducer.set_divisor(divisor)
        if buffers:
            broadcast_coalesced(self._sync_buffers_list(), self.group, src=src)
        out = self._layers(*inputs, **kwargs)
        self.require_forward_param_sync = sync
        if sync and not self._swapped_out():
            reducer.prepare_for_backward(out)
        return out

    def _swapped_out(self) -> bool:
        """Note [functional_call]
            ``torch.func.functional_call(model, {"module.weight": w, ...}, x)``
            swaps the given tensors into the module for one call. When every
            parameter is swapped out, the backward reaches none of ours (the
            gradients go to the given tensors), so, as torch DDP, nothing is
            reduced and the step is not armed. Checking the first parameter's
            slot keeps the common case O(1); a partial swap arms the step as
            usual (the swapped-out parameters get the "no gradient" error).
        """
        owner, attr, p = self._first_slot
        if owner._parameters.get(attr) is p:
            return False
        return not any(q in self._reducer_param_ids for q in map(id, self._layers.parameters()))

    @property
    def _reducer_param_ids(self) -> set[int]:
        return {id(p) for p in self._reducer.params}

    # --------------------------------------------------------- torch DDP API
    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """Reduce each bucket with ``hook(state, bucket) -> torch.futures.Future[Tensor]``, as torch DDP.

        ``bucket`` offers torch's ``GradBucket`` methods (``buffer()``, ``index()``, ``is_last()``,
        ``gradients()``, ``parameters()``, ``set_buffer()``), so torch's own hooks work unchanged.

        Example::

            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        """
        check_comm_hook(hook)
        if self._reducer.comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        if self.comm_dtype is not None:
            raise RuntimeError(f"DataParallel(comm_dtype={self.comm_dtype}) already compresses the all-reduce; "
                               "use either comm_dtype or a communication hook, not both")
        self._reducer.comm_hook_state = state
        self._reducer.comm_hook = hook

    def _set_static_graph(self) -> None:
        """torch DDP's older switch for ``static_graph=True``; call before the first forward."""
        if self._reducer._iteration or self._reducer._expect_hooks:
            raise RuntimeError("_set_static_graph() must be called before the first training iteration")
        self.static_graph = True
        comm = (self._reducer.comm_hook_state, self._reducer.comm_hook)
        self._reducer.remove_hooks()
        self._build_reducer()
        self._reducer.comm_hook_state, self._reducer.comm_hook = comm

    def _get_ddp_logging_data(self) -> dict:
        """The subset of torch DDP's logging data that describes the configuration."""
        devices = {p.device for p in self._reducer.params}
        return {"static_graph": int(self.static_graph), "find_unused_parameters": int(self.find_unused_parameters),
                "gradient_as_bucket_view": 1, "is_multi_device_module": int(len(devices) > 1),
                "bucket_cap_bytes": int(self.comm_buffer_size * 1024 * 1024), "world_size": self.world_size,
                "device_ids": ",".join(map(str, self.device_ids or [])),
                "broadcast_buffers": int(self.broadcast_buffers),
                "backend_name": tdist.get_backend(self.group) if self.world_size > 1 else ""}

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """Context manager for uneven inputs across ranks, as torch DDP's ``join``.

        Example::

            with model.join():
                for x in my_batches:          # ranks may have different numbers of batches
                    model(x).sum().backward()
        """
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs) -> JoinHook:
        """The hook torch's ``Join`` runs on a rank that ran out of inputs (``divide_by_initial_world_size``)."""
        return DataParallelJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self):
        return self.group if self.group is not None else tdist.group.WORLD

    # ---------------------------------------------------------------- pickling
    def __getstate__(self) -> dict:
        """Everything but the reducer (rebuilt on load); only with the default group, as torch DDP."""
        if self.group is not None and self.group is not tdist.group.WORLD:
            raise RuntimeError("DataParallel can be pickled / deep-copied only when it uses the default process "
                               "group (as torch DDP); pickle model.module instead")
        state = dict(self.__dict__)
        state.pop("_reducer", None)
        return state

    def __setstate__(self, state: dict) -> None:
        """A working wrapper over the loaded (or copied) module: hooks on its own parameters, no collective."""
        super().__setstate__(state)
        self.world_size = group_size(self.group)
        self._build_reducer()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the next synced backward reduces the accumulated sum.

        Example::

            with model.no_sync():
                model(x1).sum().backward()   # local only
            model(x2).sum().backward()       # averages x1 + x2 gradients across ranks
        """
        with sync_off(self):
            yield

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

    def clear_gradients(self, set_to_zero: bool = True) -> None:
        """Paddle's ``Layer.clear_gradients``: zero every parameter's gradient (``set_to_zero=False``: drop it,
        as ``zero_grad(set_to_none=True)``)."""
        self.zero_grad(set_to_none=not set_to_zero)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            layers = self._modules.get(self._module_attr)
            if layers is not None and name not in ("_reducer", "_layers") and hasattr(layers, name):
                return getattr(layers, name)
            raise
