"""Paddle's meta-optimizers, applied in eager mode: ``lamb``, ``lars``, ``localsgd``, ``adaptive_localsgd``, ``dgc``.

Paddle's dygraph fleet ignores these strategy flags (only its static-graph
meta-optimizers apply them); fleetlite applies them in eager mode.
``fleet.distributed_optimizer`` calls :func:`apply` to pick the optimizer that
really steps, and ``DistributedOptimizer.attach_model`` calls
:meth:`MetaOptimizers.attach` for what needs the model (the comm hooks of local
SGD and DGC). Each module's docstring states its formula and where it differs
from Paddle. As in Paddle, a meta-optimizer whose inner optimizer does not fit
is not applied, with a warning saying so.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

from ....parallel.sharded.rebuild import report_steps_to
from ....utils.user_warning import warn_user
from ..plan import AXES, ENGINE_WRAPPERS, ParallelPlan
from ._common import ParamNames
from .dgc import DGCMomentum
from .lamb import Lamb
from .lars import LarsMomentum

__all__ = ["Lamb", "LarsMomentum", "DGCMomentum", "LocalSGDOptimizer", "AdaptiveAverager", "ParamNames",
           "MetaOptimizers"]

_LAZY = {"LocalSGDOptimizer", "AdaptiveAverager"}  # torch.distributed.optim takes ~1 s to import: only when used


def __getattr__(name: str):
    if name in _LAZY:
        from . import localsgd

        return getattr(localsgd, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_momentum_sgd(opt: torch.optim.Optimizer) -> bool:
    return isinstance(opt, torch.optim.SGD) and any(float(g.get("momentum", 0)) > 0 for g in opt.param_groups)


def _world() -> int:
    return tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1


def _refuse_combinations(s) -> None:
    """NotImplementedError for meta-optimizers that do not combine (with each other, sharding, fp16_allreduce)."""
    on = [f for f in ("lamb", "lars", "localsgd", "adaptive_localsgd", "dgc") if getattr(s, f)]
    if len(on) > 1:
        raise NotImplementedError(f"strategy.{on[0]} and strategy.{on[1]} together: each replaces the optimizer or "
                                  "the gradient exchange, and Paddle does not combine them; turn one off")
    if on and s.sharding_enabled:  # strategy.sharding, or hybrid_configs' sharding_degree > 1 (ZeRO over its axis)
        raise NotImplementedError(f"strategy.{on[0]} with strategy.sharding (or hybrid_configs['sharding_degree'] > "
                                  "1): the sharded optimizer is rebuilt from the optimizer's class and the sharded "
                                  "model has no comm hook; turn one off")
    if on == ["dgc"] and s.fp16_allreduce:
        raise NotImplementedError("strategy.dgc with strategy.fp16_allreduce: DGC sends float32 values and "
                                  "indices, not a float16 all-reduce; turn one of them off")
    if on == ["dgc"] and s.amp and s.amp_configs["dtype"] == "float16":
        raise NotImplementedError("strategy.dgc with float16 amp: the hook would accumulate loss-scaled gradients, "
                                  "and one overflow step would leave inf in its accumulators for good; use "
                                  "amp_configs['dtype'] = 'bfloat16' (no loss scaling) or turn one off")


class _Mesh:
    """Where the meta-optimizers act, read from the parallel plan: local SGD and DGC over the ranks that hold the
    same parameters (the plan's ``loss`` group, dp x sharding x sep: not the tensor-parallel slices nor the pipeline
    stages; the world under plain data parallelism), LAMB's and LARS' slice norms over the ``mp`` group (Note
    [layer-wise norms under mp]); what the model's wrapper is (local SGD and DGC need the engine's comm hook)."""

    def __init__(self, plan: ParallelPlan | None, sharding_stage: int = 0) -> None:
        plan = plan if plan is not None else ParallelPlan({"dp": _world()}, AXES, _world())  # no fleet.init
        self.mp_group = plan.split_group("mp")
        self.data_group = plan.group_or_default("loss")  # None: the world (torch's default group)
        self.data_world = len(plan.ranks("loss"))
        self.wrapper = plan.wrapper(sharding_stage)
        self.one_rank = ("there is one rank" if plan.world_size == 1 else "the data-parallel group has one rank "
                         f"(mp_degree={plan.mp}, pp_degree={plan.pp}, dp_degree=1)")

    def refuse_without_hook(self, which: str) -> None:
        """NotImplementedError when the model's wrapper is not the engine (the pipeline: pp_degree > 1)."""
        if self.wrapper not in ENGINE_WRAPPERS:
            raise NotImplementedError(f"strategy.{which} with pp_degree > 1: the pipeline reduces its gradients "
                                      "itself and has no comm hook for it; turn one of them off")


class MetaOptimizers:
    """The meta-optimizers a strategy turns on, for one ``DistributedOptimizer``.

    ``optimizer`` is what steps (the user's optimizer, or Lamb/LarsMomentum over its groups); ``plan``: fleet's
    parallel plan, where the groups come from (None: plain data parallelism over the world).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, strategy, plan: ParallelPlan | None = None) -> None:
        self.names = ParamNames()
        self.optimizer = optimizer
        self.applied: list[str] = []
        self.mesh = _Mesh(plan, strategy.sharding_stage)
        s = strategy
        _refuse_combinations(s)
        if s.lamb:
            if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
                cfg = s.lamb_configs
                self.optimizer = Lamb(optimizer, cfg["lamb_weight_decay"], cfg["exclude_from_weight_decay"],
                                      self.names, mp_group=self.mesh.mp_group)
                self.applied.append("lamb")
            else:
                warn_user(f"strategy.lamb is on but the optimizer is {type(optimizer).__name__}: LAMB needs Adam or "
                          "AdamW (as in Paddle) and is not applied")
        if s.lars:
            if _is_momentum_sgd(optimizer):
                cfg = s.lars_configs
                self.optimizer = LarsMomentum(optimizer, cfg["lars_coeff"], cfg["lars_weight_decay"], cfg["epsilon"],
                                              cfg["exclude_from_weight_decay"], self.names,
                                              mp_group=self.mesh.mp_group)
                self.applied.append("lars")
            else:
                warn_user(f"strategy.lars is on but the optimizer is {type(optimizer).__name__} without momentum or "
                          "not SGD: LARS needs torch.optim.SGD with momentum > 0 (Paddle's Momentum) and is not "
                          "applied")
        if s.localsgd or s.adaptive_localsgd:
            self._local_sgd(optimizer, s)
        if s.dgc:
            self._dgc(optimizer, s)
        if isinstance(self.optimizer, (Lamb, LarsMomentum, DGCMomentum)):  # no "never stepped" from a scheduler
            report_steps_to(optimizer, self.optimizer)

    def _local_sgd(self, optimizer: torch.optim.Optimizer, s) -> None:
        which = "adaptive_localsgd" if s.adaptive_localsgd else "localsgd"
        world, mesh = self.mesh.data_world, self.mesh
        if not isinstance(optimizer, torch.optim.SGD) or world <= 1:
            why = f"the optimizer is {type(optimizer).__name__}, not SGD" if world > 1 else mesh.one_rank
            warn_user(f"strategy.{which} is on but {why}: local SGD needs SGD (with or without momentum) and more "
                      "than one data-parallel rank (as in Paddle) and is not applied; training is plain data parallel")
            return
        mesh.refuse_without_hook(which)
        from .localsgd import AdaptiveAverager, LocalSGDOptimizer

        group = mesh.data_group
        if s.localsgd:
            cfg = s.localsgd_configs
            self.optimizer = LocalSGDOptimizer.periodic(optimizer, cfg["k_steps"], cfg["begin_step"], group)
        else:
            cfg = s.adaptive_localsgd_configs
            averager = AdaptiveAverager(cfg["init_k_steps"], cfg["begin_step"], self._recorded_loss,
                                        lambda: optimizer.param_groups[0]["lr"], process_group=group)
            self.optimizer = LocalSGDOptimizer(optimizer, averager, cfg["begin_step"], group)
        self.optimizer.after_step = self._forget_loss
        self.applied.append(which)

    def _dgc(self, optimizer: torch.optim.Optimizer, s) -> None:
        world = self.mesh.data_world
        if not _is_momentum_sgd(optimizer) or world <= 1:
            why = self.mesh.one_rank if world <= 1 else f"the optimizer is {type(optimizer).__name__}"
            warn_user(f"strategy.dgc is on but {why}: DGC needs torch.optim.SGD with momentum > 0 (Paddle's "
                      "Momentum) and more than one data-parallel rank, and is not applied; training is dense data "
                      "parallel")
            return
        self.mesh.refuse_without_hook("dgc")
        cfg = s.dgc_configs
        self.optimizer = DGCMomentum(optimizer, cfg["rampup_begin_step"], cfg["rampup_step"], cfg["sparsity"],
                                     process_group=self.mesh.data_group)
        self.applied.append("dgc")

    @property
    def rank_local(self) -> bool:
        """Whether each rank's model and optimizer state differ (local SGD between averagings, DGC's residuals):
        a checkpoint must keep every rank's (Note [per-rank state] in ``fleetlite.trainer.checkpoint_connector``)."""
        return any(name in self.applied for name in ("localsgd", "adaptive_localsgd", "dgc"))

    @property
    def dgc_state(self):
        """The DGC hook's state (step count, bytes sent per step), or None without strategy.dgc."""
        return self.optimizer.dgc_state if isinstance(self.optimizer, DGCMomentum) else None

    _loss: torch.Tensor | None = None

    def record_loss(self, loss: torch.Tensor) -> None:
        """The loss of this step (adaptive_localsgd sets its interval from it)."""
        self._loss = loss

    def _recorded_loss(self) -> torch.Tensor:
        if self._loss is None:
            raise RuntimeError("strategy.adaptive_localsgd sets its averaging interval from the loss: pass it "
                               "through the optimizer, opt.backward(loss) or opt.minimize(loss), instead of "
                               "calling loss.backward() yourself")
        return self._loss

    def _forget_loss(self) -> None:
        self._loss = None

    def attach(self, model: torch.nn.Module) -> None:
        """Learn the model's parameter names (``exclude_from_weight_decay``); give it local SGD's or DGC's comm hook."""
        self.names.add_model(model)
        if self.applied and hasattr(self.optimizer, "attach"):  # LocalSGDOptimizer, DGCMomentum: their comm hook
            self.optimizer.attach(model)
