"""The engine's two faces: ``fleetlite.DataParallel`` (Paddle's), ``fleetlite.DistributedDataParallel`` (DDP's).

One engine (:class:`~fleetlite.parallel.data_parallel.DataParallelBase`, the
bucket plan, the reducer) and two thin classes over it. A face chooses only its
constructor signature and its reducer class; no shared code asks which face it
runs under. Where Paddle and torch DDP disagree, each face follows its own
anchor:

| Behaviour | ``DataParallel`` (Paddle's face) | ``DistributedDataParallel`` (DDP's face) | Why |
|---|---|---|---|
| Signature | Paddle's order: ``(layers, strategy=None, comm_buffer_size=25, last_comm_buffer_size=1, find_unused_parameters=False, group=None)``, then fleetlite's ``broadcast_buffers``, ``comm_dtype``; torch DDP's keywords accepted | torch DDP's order: ``(module, device_ids=None, output_device=None, dim=0, broadcast_buffers=None, init_sync=True, process_group=None, bucket_cap_mb=None, find_unused_parameters=False, ...)``; Paddle's keywords (``layers``, ``strategy``, ``comm_buffer_size``, ``last_comm_buffer_size``, ``group``, ``comm_dtype``) accepted | an import swap keeps every call as written |
| Parameters unused in every step, ``find_unused_parameters=False`` | trains: found once, on the first synced step, and reduced as unused ever after (Paddle's ``find_unused_vars_once``); a ``None`` gradient stays ``None``. If the set changes later, every rank raises the same error naming the parameters and ``find_unused_parameters=True`` | every rank raises torch DDP's error, naming the parameters and ``find_unused_parameters=True`` | each anchor's own rule (Paddle's ``reducer.cc``; DDP's reducer) |
| A parameter unused on some ranks only, first step (Paddle face) | the average on every rank | (the error above) | Paddle leaves ``None`` on the rank that did not use it, so that rank's optimizer skips it and the replicas drift apart: we agree the set across ranks once instead |
| 1. Buffers at construction | broadcast from rank 0 with the parameters (Paddle's ``sync_params_buffers``); skipped only with fleetlite's ``broadcast_buffers=False`` (DDP's meaning) or ``init_sync=False`` | exactly torch DDP's (2.14): broadcast unless the deprecated ``broadcast_buffers=False``; ``forward_sync_buffers=False`` still broadcasts them; ``init_sync=False`` skips the shape check and every broadcast | same code; Paddle has no switch, so its default is DDP's default |
| 2. ``torch.func.functional_call(model, {"module.weight": w, ...}, x)`` | works as under DDP | works as under DDP: the given tensors get the (local) gradients, the module's parameters none, nothing is all-reduced | one engine rule (Note [functional_call]); Paddle has no functional_call |
| 3. A comm hook returning something else than a ``torch.futures.Future`` | torch DDP's ``RuntimeError`` ("callback must return a torch.futures.Future object, but got int") with the fix | the same | comm hooks are torch's API (Paddle has none): torch's error |
| 4. Buffers in forward | torch DDP's rule (Note [buffer sync]): a forward that follows a synced forward broadcasts rank 0's buffers, training or eval, so validation after a training step sees rank 0's BatchNorm statistics on every rank; differs from Paddle, which never broadcasts buffers after construction | torch DDP's rule, exactly | rank 0, the source, computes exactly what Paddle computes; the other ranks hold rank 0's statistics instead of their own, which is what the Trainer's evaluation and the checkpoint (saved from rank 0) rely on |
| 5. Distributed autograd (``torch.distributed.rpc``, ``dist_autograd.backward``) | refused at backward: every rank raises an error naming RPC and distributed autograd | the same: refused (torch DDP supports it) | the engine averages ``.grad``; under distributed autograd the gradients live in the RPC context. Use torch DDP for RPC programs |
| 6. Names | the wrapped layer is ``_layers``: ``named_parameters()`` gives ``_layers.weight`` (Paddle's) | the wrapped module is ``module``: ``module.weight`` (DDP's) | each anchor's attribute; ``state_dict()`` holds the module's own keys under both, and loads either prefix |
| 7. Paddle 2.x's ``scale_loss(loss)`` / ``apply_collective_grads()`` | kept: return the loss unchanged / do nothing, with Paddle's ``DeprecationWarning`` (gradients are averaged during backward) | absent (not DDP's) | Paddle 2.x scripts call them |
"""  # noqa: E501  (a Markdown table: one row per line)

from __future__ import annotations

import torch
from torch import nn

from ..utils.user_warning import warn_user
from .data_parallel import DataParallelBase
from .reducer import Reducer
from .reducer_once import FindOnceReducer

__all__ = ["DataParallel", "DistributedDataParallel"]


class DataParallel(DataParallelBase):
    """Paddle's ``paddle.DataParallel`` on fleetlite's bucketed all-reduce engine (Paddle's rules where torch differs).

    Args:
        layers: the model (torch DDP's ``module``; either name).
        strategy: accepted for Paddle compatibility; a ``DistributedStrategy``
            supplies defaults through :func:`fleet.distributed_model` instead.
            A list here is taken as torch DDP's positional ``device_ids``.
        comm_buffer_size: bucket size in MB (float allowed; default 25); torch DDP's ``bucket_cap_mb``.
        last_comm_buffer_size: size of the last-reduced bucket in MB (default 1).
        find_unused_parameters: walk the graph every step, so the parameters a
            step uses may change from step to step (those used on no rank keep
            ``.grad``, ``None`` stays ``None``). With ``False`` (the default) the
            unused parameters are found once, on the first step, as Paddle does
            (see the table in :mod:`fleetlite.parallel.faces`).
        group: the process group (default: the world); torch DDP's ``process_group``.
        broadcast_buffers: buffers (e.g. BatchNorm statistics) follow rank 0 as
            under torch DDP (default); ``False`` also skips them at construction.
        comm_dtype: all-reduce buckets in this dtype (``torch.float16`` or
            ``torch.bfloat16``) and cast back; ``None`` keeps the gradient dtype.
        **kwargs: torch DDP's keywords (``device_ids``, ``static_graph``, ...),
            with their meaning under :class:`DistributedDataParallel`.

    Example::

        import torch, fleetlite, fleetlite.distributed as dist
        dist.init_parallel_env()
        model = fleetlite.DataParallel(torch.nn.Linear(10, 1))
        model(torch.randn(4, 10)).sum().backward()   # grads averaged over ranks
    """

    _reducer_cls = FindOnceReducer

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Paddle 2.x's ``scale_loss``: deprecated since Paddle 2.0 and a no-op there, kept for old scripts: returns
        ``loss`` unchanged (the gradients are averaged during backward)."""
        warn_user("DataParallel.scale_loss is deprecated since Paddle 2.0.0 and returns the loss unchanged: the "
                  "gradients are averaged during backward; call loss.backward() directly", DeprecationWarning)
        return loss

    def apply_collective_grads(self) -> None:
        """Paddle 2.x's ``apply_collective_grads``: deprecated since Paddle 2.0 and a no-op there, kept for old
        scripts (the gradients are already averaged when backward returns)."""
        warn_user("DataParallel.apply_collective_grads is deprecated since Paddle 2.0.0 and does nothing: the "
                  "gradients are averaged during backward; drop the call", DeprecationWarning)


class DistributedDataParallel(DataParallelBase):
    """torch's ``DistributedDataParallel`` on fleetlite's engine: swap the import, keep the class name.

    Same signature, positional order and behaviour as
    ``torch.nn.parallel.DistributedDataParallel`` (see the table in
    :mod:`fleetlite.parallel.faces` for the one refusal, distributed autograd);
    fleetlite's Paddle keyword names are accepted too: ``layers``, ``strategy``,
    ``comm_buffer_size`` (= ``bucket_cap_mb``), ``last_comm_buffer_size``,
    ``group`` (= ``process_group``), ``comm_dtype``. Arguments that change what
    torch DDP reduces and that fleetlite does not build
    (``delay_all_reduce_named_params``, ``param_to_hook_all_reduce``,
    ``mixed_precision``, ``skip_all_reduce_unused_params``,
    ``bucket_cap_mb_list``) raise ``NotImplementedError`` when set.

    Example::

        import torch, torch.distributed as dist
        from fleetlite import DistributedDataParallel as DDP   # was: from torch.nn.parallel import ...
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(10, 1))
        model(torch.randn(4, 10)).sum().backward()   # grads averaged over ranks
    """

    _reducer_cls = Reducer
    _module_attr = "module"  # torch DDP's attribute: names are module.<name>

    def __init__(self, module: nn.Module | None = None, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool | None = None, init_sync: bool = True, process_group=None,
                 bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None, mixed_precision=None,
                 device_mesh=None, skip_all_reduce_unused_params: bool = False, bucket_cap_mb_list=None,
                 batched_grad_copy: bool = False, forward_sync_buffers: bool | None = None, *,
                 layers: nn.Module | None = None, comm_buffer_size: float | None = None,
                 last_comm_buffer_size: float | None = None, group=None, comm_dtype: torch.dtype | None = None,
                 strategy=None):
        if isinstance(strategy, (list, tuple)):
            raise TypeError("DistributedDataParallel: strategy= is Paddle's keyword for a ParallelStrategy; "
                            "give the devices as device_ids=[...]")
        if broadcast_buffers is not None:  # torch DDP's (2.14) deprecation, word for word
            warn_user("Both `broadcast_buffers` and `forward_sync_buffers` were specified. `broadcast_buffers` is "
                      "deprecated and its value is ignored when `forward_sync_buffers` is provided."
                      if forward_sync_buffers is not None else
                      "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. IMPORTANT: unlike "
                      "`broadcast_buffers=False`, `forward_sync_buffers=False` still syncs buffers at init. If you "
                      "rely on buffers NOT being synced at init (e.g. rank-local buffers), keep using "
                      "`broadcast_buffers=False` until `init_sync_buffers` is available.", FutureWarning)
        super().__init__(
            layers, strategy, comm_buffer_size, last_comm_buffer_size, find_unused_parameters, group,
            broadcast_buffers, comm_dtype, module=module, device_ids=device_ids, output_device=output_device,
            dim=dim, process_group=process_group, bucket_cap_mb=bucket_cap_mb, check_reduction=check_reduction,
            gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph, init_sync=init_sync,
            device_mesh=device_mesh, forward_sync_buffers=forward_sync_buffers, batched_grad_copy=batched_grad_copy,
            delay_all_reduce_named_params=delay_all_reduce_named_params,
            param_to_hook_all_reduce=param_to_hook_all_reduce, mixed_precision=mixed_precision,
            skip_all_reduce_unused_params=skip_all_reduce_unused_params, bucket_cap_mb_list=bucket_cap_mb_list)
