"""``ShardedDataParallel``: ZeRO stages 2 and 3 (and hybrid sharding) on torch FSDP2 ``fully_shard``.

# Note [sharding units]
``fully_shard`` is applied bottom-up: first to each *unit* (a submodule whose
parameters are all-gathered and freed together), then to the root, which
takes the remaining parameters. Units are, by default, the children holding
at least ``UNIT_SHARE`` of the parameters, with containers (``ModuleList``,
``Sequential``, ``ModuleDict``) looked through; ``wrap=["Block", ...]``
makes every submodule of those classes a unit instead. Stage 2 keeps
parameters unsharded from forward to backward (``reshard_after_forward=False``:
one all-gather per step, gradients and optimizer state sharded), stage 3
frees them after each unit's forward (``True``: parameters sharded too).

# Note [hybrid sharding]
With ``sharding_degree`` d < world size w the ranks form a 2-D
``DeviceMesh`` (w/d, d) named ("replicate", "shard"): parameters are
sharded inside each group of d consecutive ranks (a node) and replicated
across groups; gradients are reduce-scattered in the group and all-reduced
across groups (FSDP2's HSDP).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from ..data_parallel import _strip_prefix, sync_off
from ..wrapped import WrappedModel
from .gloo_comms import use_gloo_comms

__all__ = ["ShardedDataParallel", "UNIT_SHARE", "is_sharded_model"]

UNIT_SHARE = 0.02
_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _default_units(model: nn.Module) -> list[nn.Module]:
    total = _numel(model)
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, _CONTAINERS):
                visit(child)
            elif total and _numel(child) >= UNIT_SHARE * total:
                units.append(child)

    visit(model)
    return units


def _named_units(model: nn.Module, wrap: Sequence[str]) -> list[nn.Module]:
    names = set(wrap)
    found = {type(m).__name__ for m in model.modules()}
    unknown = sorted(names - found)
    if unknown:
        raise ValueError(f"sharding_configs['wrap'] names module classes {unknown} that the model does not contain; "
                         f"its classes are {sorted(found)}")
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]


def build_mesh(degree: int | None, device_type: str):
    """The 1-D mesh over all ranks, or the 2-D (replicate, shard) mesh for hybrid sharding."""
    world = tdist.get_world_size()
    degree = world if degree in (None, -1, 0) else int(degree)
    if degree < 1 or degree > world or world % degree:
        raise ValueError(f"sharding_degree={degree} does not divide the {world} ranks; use a divisor of {world} "
                         "(the ranks of one node for hybrid sharding) or -1 for all ranks")
    if degree == world:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (world // degree, degree), mesh_dim_names=("replicate", "shard"))


def is_sharded_model(model: Any) -> bool:
    """True for a :class:`ShardedDataParallel` (stage 2/3) model."""
    return isinstance(model, ShardedDataParallel)


class ShardedDataParallel(WrappedModel):
    """A model whose parameters, gradients and optimizer state are sharded across ranks (FSDP2).

    Usually built by ``fleet.distributed_model`` with ``strategy.sharding_configs["stage"]`` 2 or 3, or by
    :func:`fleetlite.distributed.sharding.group_sharded_parallel`. ``state_dict()`` is collective and gives the
    full, unprefixed state on every rank (``state_dict(full=False)``: this rank's DTensor shards);
    ``load_state_dict`` takes either. An optimizer built over the original parameters is rebuilt over the
    sharded ones by ``fleet.distributed_optimizer`` (see :meth:`sharded_param`).

    Args:
        layers: the model (changed in place: its parameters become DTensor shards).
        stage: 2 (``reshard_after_forward=False``) or 3 (``True``).
        sharding_degree: ranks per sharding group; ``None``/-1 for all ranks, fewer for hybrid sharding.
        offload: keep the sharded parameters, gradients and optimizer state in CPU memory (``CPUOffloadPolicy``).
        param_dtype / reduce_dtype: FSDP2's ``MixedPrecisionPolicy`` (e.g. bfloat16 compute, float32 reduction).
        wrap: module class names that become FSDP units (Note [sharding units]).
        mesh: a 1-D ``DeviceMesh`` to shard over instead of one built from ``sharding_degree`` (the data ×
            sharding ranks of a hybrid mesh, beside tensor parallelism: Note [stage 3 beside mp]).

    Example::

        from fleetlite.distributed.sharding import ShardedDataParallel
        model = ShardedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)), stage=3)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)   # built over the shards
        model(torch.randn(4, 8)).sum().backward(); opt.step()
        full = model.state_dict()                                # collective: the full state on every rank
    """

    #: gradients left unsynchronised (a gradient-merge window) can only be reduced by a later backward, not
    #: all-reduced afterwards (fleetlite.distributed.fleet.gradient_merge, Note [open-ended window under sharding])
    reduces_in_backward_only = True

    def __init__(self, layers: nn.Module, stage: int = 3, sharding_degree: int | None = None, offload: bool = False,
                 param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
                 wrap: Sequence[str] | None = None, mesh: Any = None) -> None:
        super().__init__()
        # FSDP2 loads in ~0.5 s (DTensor, DCP): imported by the sharded stages only
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        if stage not in (2, 3):
            raise ValueError(f"ShardedDataParallel(stage={stage!r}) must be 2 or 3; stage 1 shards only the "
                             "optimizer state (fleet.distributed_optimizer with sharding stage 1)")
        if not (tdist.is_available() and tdist.is_initialized()):
            raise RuntimeError("sharding stages 2/3 need a process group: call fleet.init(...) (or "
                               "fleetlite.distributed.init_parallel_env()) first")
        if isinstance(layers, ShardedDataParallel) or hasattr(layers, "_get_fsdp_state"):
            raise ValueError("the model is already sharded; pass the plain module")
        params = list(layers.parameters())
        if not params:
            raise ValueError("the model has no parameters to shard")
        device_type = params[0].device.type
        self.stage = stage
        self.offload = bool(offload)
        self.mesh = mesh if mesh is not None else build_mesh(sharding_degree, device_type)
        self.sharding_degree = self.mesh.size(self.mesh.ndim - 1)
        names = {id(p): (n, weakref.ref(p)) for n, p in layers.named_parameters()}
        units = _named_units(layers, wrap) if wrap else _default_units(layers)
        kwargs: dict[str, Any] = {
            "mesh": self.mesh,
            "reshard_after_forward": stage == 3,
            "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
            "offload_policy": (CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload
                               else OffloadPolicy()),
        }
        self.units = [type(u).__name__ for u in units]
        for unit in units:
            fully_shard(unit, **kwargs)
        fully_shard(layers, **kwargs)
        # gloo (CPU): all-gather / reduce-scatter as all-reduces, ~2x faster there (Note [gloo sharded collectives])
        self.gloo_comms = use_gloo_comms([*units, layers], self.mesh.get_group(self.mesh.ndim - 1))
        self._layers = layers
        new = dict(layers.named_parameters())
        # id -> (weak reference to the original, its shard); the weak reference guards against a reused id
        self._replaced = {pid: (ref, new[name]) for pid, (name, ref) in names.items() if name in new}
        self._sync = True

    # ------------------------------------------------------------------ access
    @property
    def module(self) -> nn.Module:
        """The sharded model (an ``FSDPModule``)."""
        return self._layers

    def sharded_param(self, param: nn.Parameter) -> nn.Parameter:
        """The sharded parameter that replaced ``param`` (``param`` itself when it is already one of them)."""
        return self._replaced[id(param)][1] if self.replaces(param) else param

    def replaces(self, param: nn.Parameter) -> bool:
        """True when ``param`` is an original parameter that sharding replaced."""
        entry = self._replaced.get(id(param))
        return entry is not None and entry[0]() is param and entry[1] is not param

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self._layers(*inputs, **kwargs)

    # ------------------------------------------------------------------ gradient sync
    @property
    def require_backward_grad_sync(self) -> bool:
        """False inside a gradient-merge window: gradients accumulate unsharded, the next synced backward
        reduce-scatters their sum (DDP's flag, mapped to FSDP2's ``set_requires_gradient_sync``)."""
        return self._sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, flag: bool) -> None:
        self._sync = bool(flag)
        self._layers.set_requires_gradient_sync(self._sync)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (unsharded); the next synced backward reduces the accumulated sum."""
        with sync_off(self):
            yield

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the gradients by their global norm over every rank's shards; returns the total norm (a tensor)."""
        norm = nn.utils.clip_grad_norm_([p for p in self.parameters() if p.grad is not None], max_norm, norm_type)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    is_sharded = True  # (WrappedModel)

    # ---------------------------------------------------------------- state
    def load_full_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Load a full, unprefixed state into this rank's shards (every rank passes it)."""
        return self.load_state_dict(state_dict, strict=strict)

    def full_state_dict(self, rank0_only: bool = False) -> dict[str, torch.Tensor]:
        """The full, unprefixed state (collective); with ``rank0_only`` gathered to CPU on rank 0 only
        (the others get ``{}``), which is what a checkpoint needs."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # ~0.5 s; on use

        opts = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
        return get_model_state_dict(self._layers, options=opts)

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False, full: bool = True):
        """Collective: the full unprefixed state on every rank; ``full=False``: this rank's DTensor shards."""
        if not full or args or destination is not None or prefix or keep_vars:
            return self._layers.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        return OrderedDict(self.full_state_dict())

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        """Load a full state (plain tensors, every rank) or a sharded one (DTensors) into the shards."""
        # torch.distributed.checkpoint / .tensor load in ~0.5 s: on use
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.tensor import DTensor

        state = dict(_strip_prefix(state_dict))
        if any(isinstance(v, DTensor) for v in state.values()):
            return self._layers.load_state_dict(state, strict=strict, assign=assign)
        return set_model_state_dict(self._layers, state, options=StateDictOptions(full_state_dict=True,
                                                                                  strict=strict))

    def set_state_dict(self, state_dict: Mapping[str, Any], use_structured_name: bool = True):
        """Paddle's name for :meth:`load_state_dict`."""
        return self.load_state_dict(state_dict)

    set_dict = set_state_dict

    def clear_gradients(self, set_to_zero: bool = True) -> None:
        """Paddle's ``Layer.clear_gradients``: zero every parameter's gradient (``set_to_zero=False``: drop it,
        as ``zero_grad(set_to_none=True)``)."""
        self.zero_grad(set_to_none=not set_to_zero)

    def extra_repr(self) -> str:
        return (f"stage={self.stage}, sharding_degree={self.sharding_degree}, mesh={tuple(self.mesh.shape)}, "
                f"offload={self.offload}, units={len(self.units)}")

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            layers = self._modules.get("_layers")
            if layers is not None and hasattr(layers, name):
                return getattr(layers, name)
            raise
