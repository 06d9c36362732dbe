"""``strategy.localsgd`` / ``strategy.adaptive_localsgd``: local SGD on torch's model averaging, in eager mode.

Paddle's dygraph fleet ignores these flags; its static-graph meta-optimizers
(``meta_optimizers/localsgd_optimizer.py``) let each rank step on its own
gradients and average the parameters every ``k_steps`` steps after
``begin_step``. fleetlite runs the same schedule in eager mode on torch's
post-local SGD: the data-parallel model gets torch's ``post_localSGD_hook``
(gradients all-reduced for the first ``begin_step`` steps, then not at all:
``post_local_gradient_allreduce=False``), and the optimizer is a
``PostLocalSGDOptimizer`` whose averager averages the parameters
(``model_averaging.utils.average_parameters``: divided by the world size, then
summed) after the optimizer step.

Note [local SGD schedule]
    Steps count from 1, as Paddle's ``autoincreased_step_counter(begin=1)``.
    Steps ``1..begin_step`` are data parallel (Paddle averages the
    parameters after each of them, which for SGD is the same as averaging the
    gradients: fleetlite all-reduces the gradients, so the warm-up is exactly
    data parallel). After step ``s > begin_step`` the parameters are
    averaged when ``s - last == k`` (``last``: the step of the previous
    averaging, ``begin_step`` at first). ``localsgd``: ``k = k_steps``, i.e.
    at ``begin_step + k_steps, begin_step + 2 k_steps, ...``
    (``PeriodicModelAverager(period=k_steps, warmup_steps=begin_step + k_steps - 1)``,
    whose step counter starts at 0). ``adaptive_localsgd``: Paddle's rule sets
    ``k`` after every averaging (and at ``begin_step``) from the loss averaged
    over the ranks and the learning rate of that step:
    ``k = clip(ceil(sqrt(lr_0 * loss / (lr * loss_0) * init_k_steps)), 1, 16)``,
    ``lr_0``/``loss_0`` those of step 1. The loss is the one passed to
    ``DistributedOptimizer.backward`` / ``minimize`` (call one of them).

As in Paddle, local SGD is applied only with SGD (with or without momentum)
and more than one rank; otherwise a warning says it is not applied. Under
``hybrid_configs`` the parameters are averaged over the data-parallel group
only (the model-parallel ranks hold different slices): with ``dp_degree`` 1
it is not applied, with the same warning; with ``pp_degree`` > 1 and more
than one data-parallel rank it is refused (the pipeline has no comm hook). Momentum
buffers stay local (Paddle and torch average parameters only); buffers
(BatchNorm statistics) are not averaged. Sharding stage 2/3 has no comm hook
and is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.model_averaging import utils as averaging_utils
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager, PeriodicModelAverager
from torch.distributed.optim import PostLocalSGDOptimizer

__all__ = ["LocalSGDOptimizer", "AdaptiveAverager", "MAX_LOCAL_STEPS"]

MAX_LOCAL_STEPS = 16  # Paddle's AdaptiveLocalSGDOptimizer bounds k to [1, 16]
_EXTRA = "fleet_localsgd"


class AdaptiveAverager(ModelAverager):
    """Paddle's adaptive local SGD interval (Note [local SGD schedule]) as a torch ``ModelAverager``.

    ``loss()`` returns this step's local loss (a tensor), ``lr()`` the current learning rate.
    """

    def __init__(self, init_k_steps: int, begin_step: int, loss: Callable[[], torch.Tensor],
                 lr: Callable[[], float], process_group=None) -> None:
        super().__init__(process_group)
        self.init_k, self.begin = int(init_k_steps), int(begin_step)
        self.k, self.last = self.init_k, 0
        self.loss0: float | None = None
        self.lr0: float | None = None
        self._loss, self._lr = loss, lr
        self.averaged_at: list[int] = []  # steps whose parameters were averaged (after begin_step)

    def _mean_loss(self) -> float:
        value = self._loss().detach().float().reshape(1).clone()
        tdist.all_reduce(value, group=self.process_group)
        return float(value) / tdist.get_world_size(self.process_group)

    def average_parameters(self, params) -> None:
        self.step += 1
        s, lr = self.step, float(self._lr())
        mean = None
        if s == 1:
            mean = self._mean_loss()
            self.loss0, self.lr0 = mean, lr
        if s < self.begin:  # warm-up: the gradients were all-reduced; k is set again at begin_step
            return
        if s > self.begin and s - self.last != self.k:
            return
        if s > self.begin:
            averaging_utils.average_parameters_or_parameter_groups(params, self.process_group)
            self.averaged_at.append(s)
        mean = self._mean_loss() if mean is None else mean
        denominator = lr * self.loss0
        if denominator > 0 and math.isfinite(mean):
            k = math.ceil(math.sqrt(self.lr0 * mean / denominator * self.init_k))
            self.k = min(max(k, 1), MAX_LOCAL_STEPS)
        self.last = s

    def state_dict(self) -> dict[str, Any]:
        return {"k": self.k, "last": self.last, "loss0": self.loss0, "lr0": self.lr0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.k, self.last, self.loss0, self.lr0 = state["k"], state["last"], state["loss0"], state["lr0"]


class LocalSGDOptimizer(PostLocalSGDOptimizer):
    """torch's ``PostLocalSGDOptimizer`` with the comm hook that goes with it (Note [local SGD schedule]).

    ``attach(model)`` registers ``post_localSGD_hook`` on the data-parallel
    model; ``state_dict`` also keeps the adaptive interval, and loading one
    restores the hook's step count, so a resumed run does not warm up again.

    Example::

        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        opt = LocalSGDOptimizer.periodic(sgd, k_steps=4, begin_step=10)
        opt.attach(dp_model)                    # fleetlite.DataParallel or torch DDP
        loss.backward(); opt.step()             # averages after steps 14, 18, ...
    """

    def __init__(self, optim: torch.optim.Optimizer, averager: ModelAverager, begin_step: int,
                 process_group=None) -> None:
        super().__init__(optim, averager)
        self.hook_state = PostLocalSGDState(process_group=process_group, subgroup=None, start_localSGD_iter=begin_step,
                                            post_local_gradient_allreduce=False)
        self.attached = False
        self.after_step: Callable[[], None] | None = None  # e.g. forget the recorded loss

    @classmethod
    def periodic(cls, optim: torch.optim.Optimizer, k_steps: int, begin_step: int,
                 process_group=None) -> LocalSGDOptimizer:
        import warnings

        with warnings.catch_warnings():  # torch advises against period 1; Paddle's default k_steps is 1
            warnings.simplefilter("ignore")
            averager = PeriodicModelAverager(period=k_steps, warmup_steps=begin_step + k_steps - 1,
                                             process_group=process_group)
        return cls(optim, averager, begin_step, process_group)

    @property
    def state(self):
        return self.optim.state

    @property
    def defaults(self):
        return self.optim.defaults

    def attach(self, model: torch.nn.Module) -> None:
        if not self.attached:
            model.register_comm_hook(self.hook_state, post_localSGD_hook)
            self.attached = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        if not self.attached:
            raise RuntimeError("strategy.localsgd needs the data-parallel model: wrap it with "
                               "fleet.distributed_model (its gradients are all-reduced until begin_step)")
        if closure is not None:
            raise ValueError("strategy.localsgd: step(closure) is not supported; call backward, then step()")
        self.optim.step()
        self.averager.average_parameters(params=self.param_groups)
        if self.after_step is not None:
            self.after_step()

    def register_step_pre_hook(self, hook):
        return self.optim.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook):
        return self.optim.register_step_post_hook(hook)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if isinstance(self.averager, AdaptiveAverager):
            state[_EXTRA] = self.averager.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        extra = state.pop(_EXTRA, None)
        super().load_state_dict(state)
        self.param_groups = self.optim.param_groups  # torch's load built new groups: follow them (set_lr, schedulers)
        if extra is not None and isinstance(self.averager, AdaptiveAverager):
            self.averager.load_state_dict(extra)
        self.hook_state.iter = min(int(self.averager.step), self.hook_state.start_localSGD_iter)
