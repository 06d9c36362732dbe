"""The one place where the Trainer meets the environment (Lightning Fabric's connector idea).

It resolves the device, starts the fleet (``fleet.init``), and wraps the
model with ``fleet.distributed_model`` and the optimizer with
``fleet.distributed_optimizer`` using the strategy, single-process and
multi-process alike (with one rank the engine is a pass-through).

# Note [trainer strategy]
The Trainer starts the fleet with its whole strategy (``fleet.init(...,
by_trainer=True)``), gradient merge included: that is the optimizer's window,
driven by the Trainer's loop (Note [gradient merge window]). A Trainer built
without a strategy takes the one the user last gave ``fleet.init``
(``fleet.user_strategy()``), never one an earlier Trainer left: a Trainer's
own ``init`` replaces the strategy in force but not the user's, so every
Trainer without ``strategy=`` takes the user's until the user calls
``fleet.init`` again (the same degrees, so the same hybrid topology).
"""

from __future__ import annotations

import copy
import re
import warnings
from typing import Any

import torch
from torch import nn

from ..distributed import ParallelEnv, collective, fleet
from ..distributed.agreement import check_same_across_ranks
from ..distributed.env import read_env
from ..distributed.fleet.amp import warn_cpu_amp
from ..distributed.fleet.recompute import is_recomputed
from ..parallel import WrappedModel

__all__ = ["Connector", "resolve_device", "process_group_backend", "init_process_group", "compile_options",
           "unwrap_compiled"]

# Note [compile in place]
# ``Trainer(compile=...)`` compiles the network with ``nn.Module.compile`` (torch.compile of the module's own
# call, in place) before ``fleet.distributed_model`` wraps it. The module object stays the same, so its
# parameters are the ones the engine's hooks and buckets see, and ``state_dict()`` keys carry no
# ``_orig_mod.`` prefix (the prefix that ``torch.compile(module)``'s OptimizedModule adds): a compiled run's
# checkpoint loads into an uncompiled model and back. Dynamo traces at the first call, so the strategy's
# changes to the forward (recompute, amp autocast) are compiled with it.
_COMPILE_KEYS = ("fullgraph", "dynamic", "backend", "mode", "options", "disable")


# Note [one device, one process group]
# The connector alone decides this rank's device and starts the process group: ``resolve_device`` (the device,
# from ParallelEnv for "auto"/"cuda", the one source of the rank's GPU), ``process_group_backend`` (which backend
# a device setting needs) and ``init_process_group`` (idempotent). A recipe's preflight starts the group first (it
# needs it to agree on the config); the job and the Trainer's ``Connector`` call it again and find it done.
def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``: this rank's GPU when CUDA is available, else the CPU; ``"cuda"``: this rank's GPU; otherwise
    ``torch.device(device)``. Raises ValueError for a non-device or for CUDA without CUDA."""
    if device is None or device == "auto":
        return torch.device(ParallelEnv().device)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asks for CUDA but no CUDA device is available here; use "
                         "device='cpu' or 'auto'")
    if dev.type == "cuda" and dev.index is None:  # "cuda": this rank's GPU, from the one source
        return torch.device(ParallelEnv().device)
    return dev


def process_group_backend(device: str | torch.device | None) -> str:
    """The ``init_parallel_env`` backend for a device setting: ``"cpu"`` gloo, ``"cuda"`` NCCL (+ gloo for CPU
    tensors), anything else (``"auto"``, ``"cuda:1"``, a torch.device) ``"auto"`` (gloo when GPUs are short)."""
    return {"cpu": "gloo", "cuda": "nccl"}.get(device if isinstance(device, str) else "", "auto")


def init_process_group(device: str | torch.device | None = "auto") -> None:
    """Start the process group when the launcher started several ranks; idempotent, nothing with one rank.

    The backend follows the device setting (:func:`process_group_backend`); on CUDA the group's start also
    makes this rank's GPU the current device. Note [one device, one process group].
    """
    if read_env().world_size > 1:
        collective.init_parallel_env(backend=process_group_backend(device))


def compile_options(value: Any) -> dict[str, Any] | None:
    """``Trainer(compile=...)`` as ``torch.compile`` kwargs: False/None -> None, True -> {}, a dict checked."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if hasattr(value, "items"):
        opts = dict(value.items())
        bad = sorted(set(opts) - set(_COMPILE_KEYS))
        if bad:
            raise ValueError(f"compile={opts!r}: unknown torch.compile argument(s) {bad}; the known ones are "
                             f"{list(_COMPILE_KEYS)} (e.g. compile={{'mode': 'max-autotune'}})")
        return opts
    raise TypeError(f"compile must be True, False or a dict of torch.compile arguments, got {type(value).__name__}")


def unwrap_compiled(model: nn.Module) -> tuple[nn.Module, bool]:
    """(the plain module, whether it was a ``torch.compile`` OptimizedModule): Note [compile in place]."""
    orig = getattr(model, "_orig_mod", None)
    if isinstance(orig, nn.Module) and type(model).__name__ == "OptimizedModule":
        return orig, True
    return model, False



def _eager_recompute(network: nn.Module) -> None:
    """Recomputed submodules (strategy.recompute) run eagerly inside the compiled network: a graph break.

    Dynamo cannot trace ``torch.utils.checkpoint`` with the custom ``context_fn`` that keeps batch-norm
    statistics exact; ``_compiled_call_impl`` is where ``nn.Module.compile`` puts its compiled call, here
    the eager call behind ``torch.compiler.disable``.
    """
    for m in network.modules():
        if m is not network and is_recomputed(m):
            m._compiled_call_impl = torch.compiler.disable(m._call_impl)


class Connector:
    """Environment, strategy and wrapping for one Trainer.

    Example::

        conn = Connector(strategy=None, device="auto")
        wrapped, plain = conn.setup_model(net)
        dist_opt = conn.setup_optimizer(torch.optim.SGD(plain.parameters(), lr=0.1), wrapped)
    """

    def __init__(self, strategy: Any = None, device: str | torch.device | None = "auto", compile: Any = None) -> None:
        self._device_setting = device
        self.device = resolve_device(device)
        self.compile = compile_options(compile)
        self.user_strategy = strategy
        self.strategy = None  # the resolved DistributedStrategy (as the user gave it)
        self._started = False

    def _resolve_strategy(self):
        s = self.user_strategy
        if s is None:  # a strategy the user gave fleet.init applies (Note [trainer strategy])
            return fleet.user_strategy() or fleet.DistributedStrategy()
        if isinstance(s, fleet.DistributedStrategy):
            return copy.deepcopy(s)
        if isinstance(s, dict) or hasattr(s, "items"):
            return fleet.DistributedStrategy.from_dict(s)
        raise TypeError(f"strategy must be a fleet.DistributedStrategy or a dict of its fields, got "
                        f"{type(s).__name__}")

    def start(self) -> None:
        """Resolve the strategy and ``fleet.init`` with it (Note [trainer strategy])."""
        if self._started:
            return
        self.strategy = self._resolve_strategy()
        init_process_group(self._device_setting)  # Note [one device, one process group]: done when a recipe runs
        with warnings.catch_warnings():  # one process is a normal Trainer run, not a launch mistake: no warning
            warnings.filterwarnings("ignore", message=re.escape("fleetlite: world size is 1"))
            fleet.init(is_collective=True, strategy=self.strategy, by_trainer=True)  # Note [trainer strategy]
        self._started = True

    def set_strategy(self, strategy: Any, hint: str) -> None:
        """Replace the strategy before the start; after it a RuntimeError (``hint`` says what to do instead)."""
        if self._started:
            raise RuntimeError(f"the strategy cannot change after the Trainer has started (fleet is initialised, "
                               f"the model wrapped); {hint}")
        self.user_strategy = strategy

    @property
    def world_size(self) -> int:
        return collective.get_world_size()

    @property
    def rank(self) -> int:
        return collective.get_rank()

    def setup_model(self, network: nn.Module) -> tuple[nn.Module, nn.Module]:
        """(wrapped, plain) model on the device; an already wrapped model is kept."""
        self.start()
        warn_cpu_amp(self.strategy, self.device)
        if isinstance(network, WrappedModel):
            if self.compile is not None and not network.is_sharded:  # Note [compile in place]
                network.module.compile(**self.compile)
            self._warn_uncompiled(network)
            return network, network.module
        network.to(self.device)
        if self.compile is not None:  # Note [compile in place]: before wrapping, once
            network.compile(**self.compile)
        wrapped = fleet.distributed_model(network)
        if self.compile is not None:
            _eager_recompute(wrapped.module)
        self._warn_uncompiled(wrapped)
        return wrapped, wrapped.module

    def _warn_uncompiled(self, wrapped: WrappedModel) -> None:
        """Say at the start that ``compile`` does nothing for a sharded (stage 2/3) model rather than train it
        eagerly in silence: torch.compile never runs on the FSDP2-sharded module."""
        if self.compile is not None and wrapped.is_sharded and collective.get_rank() == 0:
            warnings.warn("fleetlite: Trainer(compile=...) has no effect under sharding stage 2/3 or tensor/pipeline "
                          "parallelism: the sharded (FSDP2), tensor-parallel or pipeline model runs uncompiled. Drop "
                          "compile=, or use sharding stage 1 or data parallel to train a compiled model",
                          UserWarning, stacklevel=3)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, wrapped: nn.Module):
        """The optimizer wrapped with the strategy (a ``DistributedOptimizer``, as ``fleet.distributed_optimizer``)
        and attached to ``wrapped`` (its gradient-merge window switches the model's gradient sync)."""
        self.start()
        if isinstance(optimizer, fleet.DistributedOptimizer):
            if optimizer.k_steps > 1:
                raise ValueError("the optimizer is a DistributedOptimizer with gradient merge; give the Trainer the "
                                 "plain torch optimizer (it applies the strategy itself, gradient merge included)")
            dist_opt = optimizer
        else:
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
            dist_opt = fleet.distributed_optimizer(optimizer)
        if hasattr(wrapped, "require_backward_grad_sync"):
            dist_opt.attach_model(wrapped)
        return dist_opt

    def check_same_config(self, config: Any) -> None:
        """Fail on every rank, showing the differences, when the ranks' configs differ (collective when given)."""
        if config is None or self.world_size == 1:
            return
        check_same_across_ranks("Trainer config", config, hint="build it from the same settings on every rank")
