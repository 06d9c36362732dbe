"""``BuildStrategy`` and ``ExecutionStrategy``: Paddle's knobs of the ParallelExecutor, in PyTorch meaning.

Only the knobs that change what the executor computes are honoured; Paddle's
graph-fusion and memory passes (``fuse_elewise_add_act_ops``,
``enable_inplace``, ``memory_optimize``, ...) are accepted so ported scripts
run unchanged, and have no effect (PyTorch runs eagerly).
"""

from __future__ import annotations

import enum

__all__ = ["BuildStrategy", "ExecutionStrategy"]


class _ReduceStrategy(enum.IntEnum):
    AllReduce = 0
    Reduce = 1


class _GradientScaleStrategy(enum.IntEnum):
    CoeffNumDevice = 0
    One = 1
    Customized = 2


class BuildStrategy:
    """How gradients are combined across devices (Paddle's ``paddle.static.BuildStrategy``).

    Honoured:

    * ``gradient_scale_strategy``: ``CoeffNumDevice`` (default) scales each
      device's loss gradient by ``1 / number of devices`` (all devices of all
      trainers), so gradients are averaged; ``One`` sums them.
      ``Customized`` (user-fed loss gradient) is not supported.
    * ``reduce_strategy``: ``AllReduce`` (default) or ``Reduce``; both give the
      same result here (one optimizer step on averaged gradients).
    * ``fuse_grad_size_in_MB``: size of the flat gradient buckets (MB).
    * ``sync_batch_norm``: must stay False (replicas share one process; use
      multi-process ``fleet`` training with ``strategy.sync_batch_norm``).

    Example::

        from fleetlite.static import BuildStrategy
        bs = BuildStrategy()
        bs.gradient_scale_strategy = BuildStrategy.GradientScaleStrategy.One
        bs.fuse_grad_size_in_MB = 16
    """

    ReduceStrategy = _ReduceStrategy
    GradientScaleStrategy = _GradientScaleStrategy

    _IGNORED = (
        "fuse_all_reduce_ops", "fuse_all_optimizer_ops", "fuse_elewise_add_act_ops", "fuse_bn_act_ops",
        "fuse_bn_add_act_ops", "fuse_relu_depthwise_conv", "fuse_broadcast_ops", "fuse_gemm_epilogue",
        "enable_inplace", "memory_optimize", "enable_sequential_execution", "enable_auto_fusion",
        "enable_addto", "enable_backward_optimizer_op_deps", "cache_runtime_context", "debug_graphviz_path",
        "remove_unnecessary_lock", "num_trainers", "trainer_id", "fuse_grad_size_in_num", "nccl_comm_num",
        "use_hierarchical_allreduce", "hierarchical_allreduce_inter_nranks", "build_cinn_pass",
    )

    def __init__(self) -> None:
        self.reduce_strategy = _ReduceStrategy.AllReduce
        self.gradient_scale_strategy = _GradientScaleStrategy.CoeffNumDevice
        self.fuse_grad_size_in_MB: float = 32
        self.sync_batch_norm = False
        for name in self._IGNORED:
            setattr(self, name, None)

    def _check(self) -> None:
        """Raise a clear error for a setting the executor cannot honour."""
        try:
            _GradientScaleStrategy(self.gradient_scale_strategy)
        except ValueError:
            raise ValueError(f"build_strategy.gradient_scale_strategy={self.gradient_scale_strategy!r} is not a "
                             "BuildStrategy.GradientScaleStrategy; use CoeffNumDevice or One") from None
        if self.gradient_scale_strategy == _GradientScaleStrategy.Customized:
            raise ValueError("build_strategy.gradient_scale_strategy=Customized (a user-fed loss gradient) is not "
                             "supported: scale the loss inside forward and use GradientScaleStrategy.One instead")
        try:
            _ReduceStrategy(self.reduce_strategy)
        except ValueError:
            raise ValueError(f"build_strategy.reduce_strategy={self.reduce_strategy!r} is not a "
                             "BuildStrategy.ReduceStrategy; use AllReduce or Reduce") from None
        mb = self.fuse_grad_size_in_MB
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or mb <= 0:
            raise ValueError(f"build_strategy.fuse_grad_size_in_MB={mb!r} must be a positive number of MB (e.g. 32)")
        if self.sync_batch_norm:
            raise ValueError("build_strategy.sync_batch_norm=True is not supported by the ParallelExecutor (its "
                             "replicas live in one process); train with fleet and strategy.sync_batch_norm=True "
                             "under `fleetlite launch` instead")

    def __repr__(self) -> str:
        return (f"BuildStrategy(reduce_strategy={_ReduceStrategy(self.reduce_strategy).name}, "
                f"gradient_scale_strategy={_GradientScaleStrategy(self.gradient_scale_strategy).name}, "
                f"fuse_grad_size_in_MB={self.fuse_grad_size_in_MB})")


class ExecutionStrategy:
    """How the executor runs (Paddle's ``paddle.static.ExecutionStrategy``).

    Honoured: ``num_iteration_per_drop_scope`` (default 100): every that many
    ``run`` calls the executor calls ``drop_local_exe_scopes()``.
    ``num_iteration_per_run`` must be 1. ``num_threads``,
    ``use_thread_barrier`` and ``allow_op_delay`` are accepted and have no
    effect (replicas run one after the other; CUDA kernels still overlap).

    Example::

        from fleetlite.static import ExecutionStrategy
        es = ExecutionStrategy()
        es.num_iteration_per_drop_scope = 10
    """

    def __init__(self) -> None:
        self.num_threads = 0
        self.num_iteration_per_drop_scope = 100
        self.num_iteration_per_run = 1
        self.use_thread_barrier = False
        self.allow_op_delay = False

    def _check(self) -> None:
        k = self.num_iteration_per_drop_scope
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"exec_strategy.num_iteration_per_drop_scope={k!r} must be a positive integer "
                             "(runs between two drop_local_exe_scopes() calls; Paddle's default is 100)")
        if self.num_iteration_per_run != 1:
            raise ValueError(f"exec_strategy.num_iteration_per_run={self.num_iteration_per_run!r} is not supported: "
                             "each run() call is one step on the fed batch; call run() in a loop instead")

    def __repr__(self) -> str:
        return (f"ExecutionStrategy(num_iteration_per_drop_scope={self.num_iteration_per_drop_scope}, "
                f"num_iteration_per_run={self.num_iteration_per_run})")
