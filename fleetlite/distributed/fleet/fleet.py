"""The fleet facade: ``init``, ``distributed_model``, ``distributed_optimizer`` and the worker queries.

One module-level state holds what ``init`` resolved (the strategy) and the
models and optimizers built from it, so gradient merge can switch the
models' gradient sync whichever of ``distributed_model`` /
``distributed_optimizer`` is called first.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from ...nn import SyncBatchNorm
from ...parallel import DataParallel, DataParallelBase
from ...parallel.sharded import ShardedDataParallel
from ...utils.user_warning import warn_user
from .. import collective
from ..collective import ParallelEnv
from ..env import read_env
from . import context
from .amp import DTYPES, AmpHelper, DistGradScaler, warn_cpu_amp
from .base import topology as _topology
from .context import get_strategy
from .meta_parallel.hybrid_stage3 import distributed_stage3
from .meta_parallel.pipeline.layers import PipelineLayer
from .optimizer import DistributedOptimizer
from .plan import ParallelPlan
from .recompute import apply_recompute, resolve_checkpoints
from .strategy import DistributedStrategy

__all__ = [
    "init", "distributed_model", "distributed_optimizer", "distributed_scaler", "get_strategy", "user_strategy",
    "is_initialized", "worker_index", "worker_num", "is_first_worker", "barrier_worker", "local_rank",
    "worker_endpoints", "PaddleCloudRoleMaker", "is_worker", "is_server", "get_hybrid_communicate_group",
    "get_parallel_plan",
]

logger = logging.getLogger("fleetlite.fleet")

# buffer size used when strategy.fuse_all_reduce_ops is False: every gradient gets a bucket (all-reduce) of its own
_UNFUSED_MB = 1e-9
# strategy fields applied to the model by distributed_model (a later strategy cannot change an already wrapped model)
_MODEL_FIELDS = tuple(DistributedStrategy.model_field_names())


_state = context.state  # what init keeps (context.py, shared with amp.from_strategy)


class PaddleCloudRoleMaker:
    """Paddle's role maker for collective jobs: rank and world size from the launcher's variables.

    Example::

        from fleetlite.distributed import fleet
        fleet.init(fleet.PaddleCloudRoleMaker(is_collective=True))
    """

    def __init__(self, is_collective: bool = True, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"PaddleCloudRoleMaker got unsupported arguments {sorted(kwargs)}; only "
                            "is_collective is used (ranks come from the launcher)")
        self.is_collective = bool(is_collective)

    def worker_index(self) -> int:
        return collective.get_rank()

    def worker_num(self) -> int:
        return collective.get_world_size() if collective.is_initialized() else read_env().world_size

    def is_first_worker(self) -> bool:
        return self.worker_index() == 0

    def __repr__(self) -> str:
        return f"PaddleCloudRoleMaker(is_collective={self.is_collective})"


def _as_strategy(strategy: Any) -> DistributedStrategy:
    if strategy is None:
        return DistributedStrategy()
    if isinstance(strategy, DistributedStrategy):
        return copy.deepcopy(strategy)
    if isinstance(strategy, Mapping):
        return DistributedStrategy.from_dict(strategy)
    raise TypeError(f"strategy must be a fleet.DistributedStrategy (or a dict of its fields), got "
                    f"{type(strategy).__name__}")


def _world_size() -> int:
    return collective.get_world_size() if collective.is_initialized() else read_env().world_size


def _set_log_level(level: str | int) -> None:
    if isinstance(level, str):
        value = logging.getLevelName(level.upper())
        if not isinstance(value, int):
            raise ValueError(f"log_level {level!r} is not a logging level; use DEBUG, INFO, WARNING or ERROR")
        level = value
    elif isinstance(level, bool) or not isinstance(level, int):
        raise ValueError(f"log_level must be a level name (e.g. 'INFO') or number, got {level!r}")
    logging.getLogger("fleetlite").setLevel(level)


def init(role_maker: PaddleCloudRoleMaker | None = None, is_collective: bool = True,
         strategy: DistributedStrategy | Mapping[str, Any] | None = None, log_level: str | int = "INFO", *,
         by_trainer: bool = False) -> None:
    """Initialise collective training: the process group (``init_parallel_env``) and the strategy.

    The strategy is copied (later changes to the object have no effect; pass
    it again to ``init`` or ``distributed_optimizer``). A second call keeps
    the process group and replaces the strategy. ``by_trainer``: a Trainer's own strategy; it does not replace
    the user's (:func:`user_strategy`), which every Trainer built without a strategy takes.
    """
    if role_maker is not None:
        if not isinstance(role_maker, PaddleCloudRoleMaker):
            raise TypeError(f"role_maker must be a fleet.PaddleCloudRoleMaker, got {type(role_maker).__name__}")
        is_collective = role_maker.is_collective
    if not is_collective:
        raise NotImplementedError(
            "fleet.init(is_collective=False) asks for parameter-server training, which fleetlite does not "
            "implement; use fleet.init(is_collective=True) for collective (data-parallel) training")
    resolved = _as_strategy(strategy)
    _set_log_level(log_level)
    resolved.check_supported(_world_size())  # before any process group exists
    collective.init_parallel_env()
    _state.strategy = resolved
    if not by_trainer:
        _state.user_strategy = resolved
    _state.role_maker = role_maker or PaddleCloudRoleMaker(is_collective=True)
    plan = ParallelPlan.from_strategy(resolved, _world_size(), ParallelEnv().device.type)
    if not plan.same_layout(_state.plan):
        _state.plan = plan  # a new strategy with other degrees or order: a new plan (the same one keeps its groups)
    if plan.needs_groups(resolved.sharding_stage):  # a split model, or the optimizer state over a sharding axis
        _topology.hcg_of(_state.plan)  # builds the mesh and its groups (collective: every rank calls init)
    if worker_index() == 0:
        logger.info("fleet initialised: %d worker(s), %r", worker_num(), resolved)


def get_hybrid_communicate_group() -> _topology.HybridCommunicateGroup:
    """Paddle's ``fleet.get_hybrid_communicate_group()``: the groups of ``hybrid_configs``' axes for this rank.

    Paddle's view of the parallel plan (:func:`get_parallel_plan`), whose mesh and groups :func:`init` builds when
    ``mp_degree``/``pp_degree``/``sep_degree`` > 1; for a data-parallel strategy on the first call (collective
    there: call it on every rank).

    Example::

        hcg = fleet.get_hybrid_communicate_group()
        print(hcg.get_data_parallel_rank(), hcg.get_model_parallel_rank(), hcg.get_stage_id())
    """
    _require_init("get_hybrid_communicate_group")
    return _topology.hcg_of(_state.plan)


def get_parallel_plan() -> ParallelPlan:
    """The :class:`~fleetlite.distributed.fleet.plan.ParallelPlan` ``fleet.init`` made: the hybrid degrees, the one
    named ``DeviceMesh`` and the groups by purpose (``data``, ``loss``, ``model``, each axis; Note [plan groups]).

    Example::

        plan = fleet.get_parallel_plan()
        plan.dp, plan.mp, plan.pp_enabled
        torch.distributed.all_reduce(loss, group=plan.group("loss"))   # builds the mesh on first use (collective)
    """
    _require_init("get_parallel_plan")
    return _state.plan


def is_initialized() -> bool:
    """True after :func:`init`."""
    return _state.strategy is not None


def _require_init(what: str) -> DistributedStrategy:
    if _state.strategy is None:
        raise RuntimeError(f"fleet.{what} was called before fleet.init(); call "
                           "fleet.init(is_collective=True, strategy=...) first")
    return _state.strategy


def user_strategy() -> DistributedStrategy | None:
    """A copy of the strategy the user last gave :func:`init` (or :func:`distributed_optimizer`); None before.

    A Trainer's own ``init`` does not change it (Note [trainer strategy]).
    """
    return None if _state.user_strategy is None else copy.deepcopy(_state.user_strategy)


def _first_device(module: nn.Module) -> torch.device:
    for p in module.parameters():
        return p.device
    return ParallelEnv().device


def _to_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() and value.dtype != torch.float32 else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_to_float32(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_float32(v) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _to_float32(v)) for k, v in value.items())
    return value


class _AutocastForward:
    """A module's forward under ``torch.autocast``, floating outputs returned in float32 (strategy.amp).

    The autocast device type follows the module's parameters at each call, so moving the model after
    ``distributed_model`` (e.g. ``.cuda()``) keeps amp on the right device.
    """

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        self.original = module.forward
        self.module = module
        self.dtype = dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(_first_device(self.module).type, dtype=self.dtype):
            out = self.original(*args, **kwargs)
        return _to_float32(out)


def distributed_model(model: nn.Module) -> nn.Module:
    """Apply the model-side strategies and wrap ``model`` in :class:`fleetlite.DataParallel`.

    In order: ``sync_batch_norm`` (BatchNorm layers become
    :class:`fleetlite.nn.SyncBatchNorm`), ``recompute`` (named submodules),
    ``amp`` (forward under autocast, outputs in float32), then DataParallel
    with ``fuse_grad_size_in_MB`` / ``last_comm_group_size_MB`` as bucket
    sizes, ``find_unused_parameters`` and, with ``fp16_allreduce``, the
    buckets all-reduced in float16/bfloat16. With sharding stage 2 or 3 the
    last step is :class:`~fleetlite.distributed.sharding.ShardedDataParallel`
    (FSDP2) instead; an optimizer over the original parameters is rebuilt over
    the shards when it meets the model. Under ``hybrid_configs``: a
    :class:`PipelineLayer` becomes a ``PipelineParallel`` (the strategies above
    applied to its stage: Note [pipeline strategies]), a model with mp > 1 a
    ``TensorParallel`` over dp × sharding (Note [sharding with mp and pp]); there sharding stage 2 is not FSDP2
    but each gradient reduced to its ZeRO owner (Note [hybrid sharding stage 2]). The parallel plan decides the
    steps, once (Note [apply order] in plan.py): ``fleet.get_parallel_plan().apply_steps(...)``.
    """
    strategy = _require_init("distributed_model")
    strategy.check_supported(_world_size())
    if not isinstance(model, nn.Module):
        raise TypeError(f"distributed_model needs a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, (DataParallelBase, nn.parallel.DistributedDataParallel, ShardedDataParallel)):
        raise ValueError(f"the model is already wrapped in {type(model).__name__}; pass the plain module to "
                         "fleet.distributed_model")
    plan = _state.plan
    stages = model.get_num_stages() if isinstance(model, PipelineLayer) else None
    steps = plan.apply_steps(strategy.sharding_stage, stages, distributed=collective.is_initialized())
    for step in steps:  # Note [apply order]: the model-side strategies, then one wrapper
        model = _APPLY[step](model, strategy, plan)
    return model


def _register(wrapped: nn.Module) -> nn.Module:
    """Keep a model whose gradients the engine or FSDP2 reduces, and attach the optimizers built before it over its
    parameters (gradient merge, sharding stage 2/3, the meta-optimizers' comm hooks)."""
    _state.models.add(wrapped)
    params = {id(p) for p in wrapped.parameters()}
    for opt in list(_state.optimizers):
        opt_params = [p for g in opt.param_groups for p in g["params"]]
        if any(id(p) in params or getattr(wrapped, "replaces", lambda _: False)(p) for p in opt_params):
            opt.attach_model(wrapped)
    return wrapped


def _model_strategies(model: nn.Module, strategy: DistributedStrategy, plan: ParallelPlan) -> nn.Module:
    """sync_batch_norm, recompute and amp on the whole model, in that order (the names checked first)."""
    if strategy.recompute:  # validate the names before changing anything
        resolve_checkpoints(model, strategy.recompute_configs["checkpoints"])
    if strategy.sync_batch_norm:
        model = SyncBatchNorm.convert_sync_batchnorm(model)
    if strategy.recompute:
        apply_recompute(model, strategy.recompute_configs["checkpoints"])
    if strategy.amp:
        param = next(model.parameters(), None)
        warn_cpu_amp(strategy, param.device if param is not None else torch.device("cpu"))  # once per process
        model.forward = _AutocastForward(model, DTYPES[strategy.amp_configs["dtype"]])
    if strategy.sharding_stage >= 2 and not collective.is_initialized():
        warn_user(f"sharding stage {strategy.sharding_stage} with a single process: nothing to shard across, "
                  "the model is not sharded")
    return model


def _stage_strategies(model: PipelineLayer, strategy: DistributedStrategy, plan: ParallelPlan) -> PipelineLayer:
    """sync_batch_norm, recompute and amp on this rank's pipeline stage (Note [pipeline strategies])."""
    hcg = _topology.hcg_of(plan)
    # Note [pipeline strategies]
    # The model-side strategies apply to this rank's stage, in distributed_model's order, each checked on every
    # stage (one all_gather over the pipe group) before anything changes, so a bad setting fails everywhere:
    # - sync_batch_norm: the stage's batch norms synchronise over dp × sharding (the ranks holding this stage);
    #   statistics are per micro-batch, as in Paddle;
    # - recompute: recompute_configs' checkpoints name the stages' submodules (global layer index paths);
    # - amp: each stage's forward under autocast, its floating outputs cast to float32, so what crosses a stage
    #   boundary has the dtype the schedule's metadata inference saw (a bfloat16/float16 value is exact in
    #   float32: the next stage's autocast casts it back unchanged). float16 loss scaling: train_batch scales
    #   each micro-batch's loss with the DistributedOptimizer's scaler, whose skip decision is agreed by every
    #   rank (Note [amp skip consistency]).
    names = _pipeline_checkpoints(model, strategy, hcg) if strategy.recompute else []
    if strategy.sync_batch_norm:
        _pipeline_sync_batch_norm(model, hcg)
    if names:
        apply_recompute(model, names)
    if strategy.amp:
        warn_cpu_amp(strategy, _first_device(model))
        model.forward = _AutocastForward(model, DTYPES[strategy.amp_configs["dtype"]])
    return model


def _pipeline_checkpoints(model: PipelineLayer, strategy: DistributedStrategy, hcg) -> list[str]:
    """``recompute_configs['checkpoints']`` held by this stage; a name that no stage holds fails on every stage.

    The names are this stage's ``named_modules`` paths (layers by global index: ``"3"``, ``"3.fc"``,
    ``shared_layers.<key>``); the stages agree on which names they hold (one ``all_gather_object`` over the
    pipe group), so a typo is one KeyError on every rank instead of a hang.
    """
    names = strategy.recompute_configs["checkpoints"]
    if not names or isinstance(names, str) or not all(isinstance(n, str) for n in names):
        resolve_checkpoints(model, names)  # the same ValueError on every rank
    local = [n for n in names if n in {m for m, _ in model.named_modules() if m}]
    held: list[Any] = [None] * hcg.get_pipe_parallel_world_size()
    torch.distributed.all_gather_object(held, local, group=hcg.get_pipe_parallel_group())
    missing = [n for n in names if not any(n in h for h in held)]
    if missing:
        raise KeyError(f"recompute checkpoints {missing} name no submodule of any pipeline stage; the stages' "
                       f"layers are named by their global index ('0' to '{model._num_layers - 1}'), their "
                       "submodules '<index>.<name>' "
                       "and shared layers 'shared_layers.<key>' (or use PipelineLayer(..., recompute_interval=N))")
    return local


def _pipeline_sync_batch_norm(model: PipelineLayer, hcg) -> None:
    """This stage's BatchNorm layers become SyncBatchNorm over the ranks that hold the stage and read other data
    (dp × sharding); the stage's run list is pointed at the converted layers."""
    local = [n for n, m in model.shared_layers.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    shared: list[Any] = [None] * hcg.get_pipe_parallel_world_size()
    torch.distributed.all_gather_object(shared, local, group=hcg.get_pipe_parallel_group())  # fail on every stage
    if any(shared):
        raise NotImplementedError(f"strategy.sync_batch_norm with a batch norm inside a SharedLayerDesc layer "
                                  f"({sorted({n for s in shared for n in s})}) is not supported; keep batch norm "
                                  "out of shared layers or turn sync_batch_norm off")
    before = dict(model.named_children())
    SyncBatchNorm.convert_sync_batchnorm(model, process_group=hcg.get_data_sharding_parallel_group())
    swapped = {id(old): new for name, old in before.items() if (new := getattr(model, name)) is not old}
    model.run_function = [swapped.get(id(f), f) for f in model.run_function]


def _sharded(model: nn.Module, strategy: DistributedStrategy, plan: ParallelPlan) -> nn.Module:
    """Stage 2/3 alone: FSDP2 over the sharding degree's mesh; amp's dtype is the parameter (compute) dtype."""
    cfg = strategy.sharding_configs
    param_dtype = DTYPES[strategy.amp_configs["dtype"]] if strategy.amp else None
    reduce_dtype = DTYPES[strategy.fp16_allreduce_configs["dtype"]] if strategy.fp16_allreduce else (
        torch.float32 if param_dtype is not None else None)
    return _register(ShardedDataParallel(
        model, stage=strategy.sharding_stage, sharding_degree=strategy.sharding_degree(_world_size()),
        offload=cfg["offload"], param_dtype=param_dtype, reduce_dtype=reduce_dtype, wrap=cfg["wrap"] or None))


def _pipeline(model: PipelineLayer, strategy: DistributedStrategy, plan: ParallelPlan) -> nn.Module:
    """pp_degree > 1: Paddle's ``PipelineParallel(layers, hcg, strategy=...)`` (meta_parallel/pipeline/); not kept
    for the optimizers to attach to: the pipeline reduces its own gradients."""
    from .meta_parallel.pipeline.parallel import PipelineParallel  # torch.distributed.pipelining: only when used

    return PipelineParallel(model, hcg=_topology.hcg_of(plan), strategy=strategy)


def _engine_args(strategy: DistributedStrategy) -> dict[str, Any]:
    """The data-parallel engine's settings from the strategy (bucket sizes, unused parameters, fp16_allreduce):
    the same for plain data parallelism and the engine under TensorParallel and SegmentParallel."""
    fused = strategy.fuse_all_reduce_ops
    return {"comm_buffer_size": strategy.fuse_grad_size_in_MB if fused else _UNFUSED_MB,
            "last_comm_buffer_size": strategy.last_comm_group_size_MB if fused else _UNFUSED_MB,
            "find_unused_parameters": strategy.find_unused_parameters,
            "comm_dtype": DTYPES[strategy.fp16_allreduce_configs["dtype"]] if strategy.fp16_allreduce else None}


def _tensor(model: nn.Module, strategy: DistributedStrategy, plan: ParallelPlan) -> nn.Module:
    """mp_degree > 1: TensorParallel (replicated parameters agreed over mp, the engine over dp × sharding)."""
    from .meta_parallel import TensorParallel

    return _register(TensorParallel(model, _topology.hcg_of(plan), strategy, **_engine_args(strategy)))


def _tensor_stage3(model: nn.Module, strategy: DistributedStrategy, plan: ParallelPlan) -> nn.Module:
    """Sharding stage 3 beside mp: FSDP2 over dp × sharding (Note [stage 3 beside mp])."""
    return _register(distributed_stage3(model, strategy, _topology.hcg_of(plan)))


def _segment(model: nn.Module, strategy: DistributedStrategy, plan: ParallelPlan) -> nn.Module:
    """sep_degree > 1: SegmentParallel, the engine over dp × sep (meta_parallel/segment_parallel.py)."""
    from .meta_parallel import SegmentParallel

    return _register(SegmentParallel(model, _topology.hcg_of(plan), strategy, **_engine_args(strategy)))


def _data(model: nn.Module, strategy: DistributedStrategy, plan: ParallelPlan) -> nn.Module:
    return _register(DataParallel(model, **_engine_args(strategy)))


#: the step functions of ParallelPlan.apply_steps' names (Note [apply order])
_APPLY = {"strategies": _model_strategies, "stage_strategies": _stage_strategies, "pipeline": _pipeline,
          "tensor": _tensor, "tensor_stage3": _tensor_stage3, "segment": _segment, "sharded": _sharded,
          "data": _data}


def distributed_optimizer(optimizer: torch.optim.Optimizer,
                          strategy: DistributedStrategy | Mapping[str, Any] | None = None) -> DistributedOptimizer:
    """Wrap ``optimizer`` with the optimizer-side strategies (gradient merge, sharding stage 1, amp, and the
    meta-optimizers lamb, lars, localsgd, adaptive_localsgd and dgc, applied in eager mode:
    :mod:`~fleetlite.distributed.fleet.meta_optimizers`).

    A ``strategy`` given here replaces the one from :func:`init` (with a warning, as in Paddle).
    """
    current = _require_init("distributed_optimizer")
    if strategy is not None:
        new = _as_strategy(strategy)
        msg = ("a strategy passed to fleet.distributed_optimizer overrides the one given to fleet.init; "
               "prefer passing it to fleet.init")
        changed = [f for f in _MODEL_FIELDS if getattr(new, f) != getattr(current, f)]
        if len(_state.models) and changed:
            msg += (f". It changes model-side fields {changed} that distributed_model already applied with the old "
                    "strategy: wrap the model again (or pass the strategy to fleet.init) for them to take effect")
        warnings.warn(msg, stacklevel=2)
        _state.strategy = _state.user_strategy = current = new
    current.check_supported(_world_size())
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"distributed_optimizer needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    device = params[0].device if params else ParallelEnv().device
    amp = AmpHelper.from_strategy(current, device)
    dist_opt = DistributedOptimizer(optimizer, current, amp=amp, group=_hybrid_sharding_group(current))
    ids = {id(p) for p in params}
    for model in list(_state.models):
        replaced = getattr(model, "replaces", lambda _: False)  # sharding stage 2/3 swapped the parameters
        if any(id(p) in ids for p in model.parameters()) or any(replaced(p) for p in params):
            dist_opt.attach_model(model)
    _state.optimizers.add(dist_opt)
    return dist_opt


def _hybrid_sharding_group(strategy: DistributedStrategy) -> Any:
    """The group whose ranks partition the optimizer state, as the plan says (``optimizer_state_axis``: stage 1 over
    hybrid_configs' sharding axis, stage 2 beside mp/pp; Notes [sharding with mp and pp], [hybrid sharding stage
    2]); None: every rank (plain stage 1), or FSDP2 (plain stages 2/3)."""
    plan = _state.plan
    axis = plan.optimizer_state_axis(strategy.sharding_stage) if plan is not None and plan.built else None
    return None if axis is None else plan.group(axis)


def distributed_scaler(scaler: torch.amp.GradScaler) -> DistGradScaler:
    """Paddle's ``fleet.distributed_scaler``: a scaler like ``scaler`` whose inf/nan skip agrees on every rank.

    Scale, growth/backoff factors, interval and state are carried over; the
    scale backs off on every inf/nan step, as torch's scaler does.
    """
    if isinstance(scaler, DistGradScaler):
        return scaler
    if not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"distributed_scaler needs a torch.amp.GradScaler, got {type(scaler).__name__}")
    if not scaler.is_enabled():  # a disabled scaler keeps none of its settings (torch drops them)
        return DistGradScaler(scaler._device, enabled=False, decr_every_n_nan_or_inf=1)
    out = DistGradScaler(scaler._device, init_scale=scaler.get_scale(),
                         growth_factor=scaler.get_growth_factor(), backoff_factor=scaler.get_backoff_factor(),
                         growth_interval=scaler.get_growth_interval(), enabled=True,
                         decr_every_n_nan_or_inf=1)
    out.load_state_dict(scaler.state_dict())
    return out


def worker_index() -> int:
    """This worker's rank."""
    return collective.get_rank()


def worker_num() -> int:
    """Number of workers."""
    return _world_size()


def is_worker() -> bool:
    """True: in collective training every process is a worker (Paddle's ``fleet.is_worker``)."""
    return True


def is_server() -> bool:
    """False: collective training has no parameter servers (Paddle's ``fleet.is_server``)."""
    return False


def is_first_worker() -> bool:
    """True on rank 0."""
    return worker_index() == 0


def barrier_worker() -> None:
    """Wait for every worker (a no-op single-process)."""
    collective.barrier()


def local_rank() -> int:
    """This worker's rank on its node."""
    return ParallelEnv().local_rank


def worker_endpoints(to_string: bool = False) -> list[str] | str:
    """The workers' HOST:PORT endpoints (as one comma-separated string with ``to_string``)."""
    eps = ParallelEnv().trainer_endpoints
    return ",".join(eps) if to_string else eps


def _reset() -> None:
    """Forget the strategy, its plan, models and optimizers (tests)."""
    context.reset()
