"""Mixed precision for the fleet facade (and the Trainer): autocast + a rank-consistent loss scaler.

:class:`AmpHelper` is configured from ``strategy.amp`` / ``strategy.amp_configs``
and gives the three things a training step needs: ``autocast()``, loss
scaling (``scale`` / ``backward``) and a guarded ``step(optimizer)`` that
unscales, skips on inf/nan and updates the scale. ``float16`` uses
:class:`DistGradScaler`; ``bfloat16`` needs no scaler (the helper's scaler is
disabled and ``step`` just steps).

Note [amp skip consistency]
    A rank that sees inf/nan must not step alone: parameters would diverge
    across ranks. With the data-parallel engine the all-reduce already
    spreads an inf to every rank before unscaling (also after gradient
    merge, whose last micro-batch reduces the accumulated sum), but
    :class:`DistGradScaler` does not rely on that: after unscaling it
    all-reduces (MAX) the found-inf flag, so every rank takes the same
    skip decision and applies the same scale update, with or without the
    engine (``no_sync`` + hand reduction, sharded optimizers, ...).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as tdist
from torch.amp.grad_scaler import OptState

from ...parallel.comm import group_size
from ...utils.user_warning import warn_once
from ..collective import ParallelEnv, collective_device
from .context import get_strategy
from .strategy import DistributedStrategy

__all__ = ["DistGradScaler", "AmpHelper", "from_strategy", "DTYPES", "warn_cpu_amp", "CPU_AMP_NOTE"]

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class DistGradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` whose skip decision and scale update agree on every rank, with Paddle's rules.

    Differences from torch's scaler (both follow Paddle's ``update_loss_scaling``):
    the scale backs off only after ``decr_every_n_nan_or_inf`` consecutive
    inf/nan steps (and never below 1), and ``use_dynamic_loss_scaling=False``
    keeps a static scale (inf/nan steps are still skipped). See Note [amp skip consistency].

    Example::

        scaler = DistGradScaler("cpu", init_scale=1024.0)
        loss = model(x).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)      # skipped on every rank if any rank found inf/nan
        scaler.update()
    """

    def __init__(self, device: str = "cuda", init_scale: float = 32768.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.8, growth_interval: int = 1000, enabled: bool = True,
                 decr_every_n_nan_or_inf: int = 2, dynamic: bool = True, group=None) -> None:
        super().__init__(device, init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)
        if isinstance(decr_every_n_nan_or_inf, bool) or not isinstance(decr_every_n_nan_or_inf, int) \
                or decr_every_n_nan_or_inf < 1:
            raise ValueError(f"decr_every_n_nan_or_inf must be an integer >= 1, got {decr_every_n_nan_or_inf!r}")
        self._decr_every = decr_every_n_nan_or_inf
        self._dynamic = bool(dynamic)
        self._group = group
        self._incr_count = 0
        self._decr_count = 0
        self._incr_t: torch.Tensor | None = None  # the counters on the scale's device (update() stays there)
        self._decr_t: torch.Tensor | None = None
        self._found_value: bool | None = False
        self._found_tensor: torch.Tensor | None = None

    # -- Note [amp skip consistency]: one flag all-reduce wherever torch checks for inf/nan -------------------
    def _agree(self, found: dict) -> None:
        """Make every rank's found-inf flags the MAX over ranks: one collective, no host sync."""
        self._found_value = None
        self._found_tensor = sum(t.reshape(1).to(next(iter(found.values())).device) for t in found.values()) \
            if found else None
        if not found or group_size(self._group) == 1:
            return
        first = next(iter(found.values()))
        device = collective_device(first.device, self._group)  # by the flag's device (Note [per-device backends])
        flag = torch.zeros(1, device=device)
        for t in found.values():
            flag += t.to(device, non_blocking=True).reshape(1)
        tdist.all_reduce(flag, op=tdist.ReduceOp.MAX, group=self._group)
        for t in found.values():
            t.copy_(flag.to(t.device, non_blocking=True).reshape(t.shape))
        self._found_tensor = flag

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        super().unscale_(optimizer)
        if self._enabled:
            self._agree(self._per_optimizer_states[id(optimizer)]["found_inf_per_device"])

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        # torch's path for optimizers that unscale inside their fused kernel (fused Adam/SGD): it checks for
        # inf/nan here instead of in unscale_, so the ranks must agree here too
        found = super()._check_inf_per_device(optimizer)
        self._agree(found)
        return found

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        # torch reads the (agreed) flags once here: the step's one host sync; kept for last_found_inf
        self._found_value = bool(sum(v.item() for v in optimizer_state["found_inf_per_device"].values()))
        return None if self._found_value else optimizer.step(*args, **kwargs)

    @property
    def last_found_inf(self) -> bool:
        """Whether the last step found inf/nan (and was skipped) on any rank; reads the device only when torch
        did not already (fused optimizers)."""
        if self._found_value is None and self._found_tensor is not None:
            self._found_value = bool(self._found_tensor.item())
        return bool(self._found_value)

    @last_found_inf.setter
    def last_found_inf(self, value: bool) -> None:
        self._found_value, self._found_tensor = bool(value), None

    def _counters(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._incr_t is None or self._incr_t.device != device:
            self._incr_t = torch.tensor(self._incr_count, dtype=torch.int32, device=device)
            self._decr_t = torch.tensor(self._decr_count, dtype=torch.int32, device=device)
        return self._incr_t, self._decr_t

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Paddle's ``update_loss_scaling`` on the device: no host sync (the scale and counters stay tensors)."""
        if not self._enabled:
            return
        if new_scale is not None:
            super().update(new_scale)
            return
        found = [t for state in self._per_optimizer_states.values()
                 for t in state.get("found_inf_per_device", {}).values()]
        if not found:
            super().update()  # raises torch's "No inf checks were recorded prior to update."
            return
        scale, _ = self._check_scale_growth_tracker("update")
        inf = sum(t.to(scale.device, non_blocking=True) for t in found) > 0
        if self._dynamic:
            incr, decr = self._counters(scale.device)
            decr.copy_(torch.where(inf, decr + 1, torch.zeros_like(decr)))
            incr.copy_(torch.where(inf, torch.zeros_like(incr), incr + 1))
            back_off = inf & (decr >= self._decr_every)
            grow = ~inf & (incr >= self._growth_interval)
            grown = scale * self._growth_factor
            new = torch.where(back_off, torch.clamp(scale * self._backoff_factor, min=1.0),
                              torch.where(grow & torch.isfinite(grown), grown, scale))
            decr.masked_fill_(back_off, 0)
            incr.masked_fill_(grow, 0)
            scale.copy_(new)
        self._found_tensor = inf
        self._per_optimizer_states.clear()  # what torch's update() resets, without its scale arithmetic

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._enabled:
            if self._incr_t is not None:
                self._incr_count, self._decr_count = int(self._incr_t.item()), int(self._decr_t.item())
            state.update(incr_count=self._incr_count, decr_count=self._decr_count)
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        state = dict(state_dict)
        self._incr_count = int(state.pop("incr_count", 0))
        self._decr_count = int(state.pop("decr_count", 0))
        self._incr_t = self._decr_t = None
        super().load_state_dict(state)


class AmpHelper:
    """Autocast context + loss scaler for one training loop, built from the fleet strategy.

    ``enabled=False`` makes every method a pass-through, so a loop can always
    go through the helper. The Trainer and ``fleet.distributed_optimizer`` use it.

    Example::

        from fleetlite.distributed import fleet
        strategy = fleet.DistributedStrategy(amp=True, amp_configs={"dtype": "bfloat16"})
        amp = fleet.amp.from_strategy(strategy, device="cpu")
        with amp.autocast():
            loss = loss_fn(model(x), y)
        amp.backward(loss)
        stepped = amp.step(optimizer)    # False when the step was skipped (inf/nan), on every rank
        optimizer.zero_grad()
    """

    def __init__(self, enabled: bool = False, dtype: str | torch.dtype = "float16",
                 device: str | torch.device | torch.nn.Module | None = None,
                 scaler: DistGradScaler | None = None) -> None:
        if isinstance(dtype, str):
            if dtype not in DTYPES:
                raise ValueError(f"amp dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
            dtype = DTYPES[dtype]
        if dtype not in DTYPES.values():
            raise ValueError(f"amp dtype {dtype} is not supported; use torch.float16 or torch.bfloat16")
        self.enabled = bool(enabled)
        self.dtype = dtype
        self.device_type = _device_of(device).type
        if scaler is None:
            use_scaler = self.enabled and dtype == torch.float16
            scaler = DistGradScaler(self.device_type, enabled=use_scaler)
        self.scaler = scaler
        self._scaled = False

    @classmethod
    def from_strategy(cls, strategy=None, device: str | torch.device | torch.nn.Module | None = None,
                      group=None) -> AmpHelper:
        """Map ``strategy.amp``/``amp_configs`` to autocast and a :class:`DistGradScaler` on ``device``
        (a device, or a model whose parameters' device is used; default: this rank's device)."""
        strategy = strategy if strategy is not None else DistributedStrategy()
        device = _device_of(device)
        cfg = strategy.amp_configs
        enabled = bool(strategy.amp)
        use_scaler = enabled and cfg["dtype"] == "float16"
        scaler = DistGradScaler(torch.device(device).type, init_scale=float(cfg["init_loss_scaling"]),
                                growth_factor=cfg["incr_ratio"], backoff_factor=cfg["decr_ratio"],
                                growth_interval=cfg["incr_every_n_steps"], enabled=use_scaler,
                                decr_every_n_nan_or_inf=cfg["decr_every_n_nan_or_inf"],
                                dynamic=cfg["use_dynamic_loss_scaling"], group=group)
        return cls(enabled, cfg["dtype"], device, scaler)

    @property
    def uses_scaler(self) -> bool:
        """True when losses must be scaled (float16 amp)."""
        return self.scaler.is_enabled()

    def autocast(self):
        """``torch.autocast`` for this device and dtype (a no-op context when amp is off)."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss multiplied by the current loss scale (unchanged without a scaler)."""
        self._scaled = True
        return self.scaler.scale(loss)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``scale(loss).backward(**kwargs)``."""
        self.scale(loss).backward(**kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the scale now (e.g. before clipping); ``step`` then skips unscaling."""
        self._check_scaled()
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, grad_divisor: float = 1.0) -> bool:
        """Unscale, skip on inf/nan (consistently across ranks), step, update the scale.

        ``grad_divisor`` divides the gradients before the step (gradient merge
        averaging). Returns True when the optimizer stepped.
        """
        if isinstance(getattr(optimizer, "amp", None), AmpHelper) and optimizer.amp is not self:
            raise ValueError("this optimizer comes from fleet.distributed_optimizer and applies amp itself; call "
                             "optimizer.backward(loss) and optimizer.step() (or optimizer.minimize(loss)) instead "
                             "of going through another AmpHelper")
        if not self.uses_scaler:
            _divide_grads(optimizer, grad_divisor)
            optimizer.step()
            self._scaled = False
            return True
        self._check_scaled()
        state = self.scaler._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.READY:
            self.scaler.unscale_(optimizer)
        _divide_grads(optimizer, grad_divisor)
        self.scaler.step(optimizer)
        self.scaler.update()
        self._scaled = False
        return not self.scaler.last_found_inf  # what the step already read: no second sync

    def _check_scaled(self) -> None:
        if self.uses_scaler and not self._scaled:
            raise RuntimeError(
                "amp with dtype 'float16' needs the loss scaled before backward, but the gradients were made "
                "without it (a plain loss.backward()). Use optimizer.minimize(loss), optimizer.backward(loss) or "
                "amp.backward(loss) instead of loss.backward() (or use amp_configs dtype 'bfloat16', which needs "
                "no scaling).")

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def __repr__(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        scale = f", scale={self.scaler.get_scale()}" if self.uses_scaler else ""
        return f"AmpHelper(enabled={self.enabled}, dtype={dtype}, device_type={self.device_type}{scale})"


def _device_of(device: str | torch.device | torch.nn.Module | None) -> torch.device:
    """A device; a model's is where its parameters are; None is this rank's (``ParallelEnv().device``)."""
    if isinstance(device, torch.nn.Module):
        param = next(iter(device.parameters()), None)
        device = None if param is None else param.device
    if device is None:
        return ParallelEnv().device
    return torch.device(device)


def _divide_grads(optimizer: torch.optim.Optimizer, divisor: float) -> None:
    if divisor == 1:
        return
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.div_(divisor)


def from_strategy(strategy=None, device: str | torch.device | torch.nn.Module | None = None,
                  group=None) -> AmpHelper:
    """:meth:`AmpHelper.from_strategy`; with ``strategy=None`` the one kept by ``fleet.init`` is used."""
    if strategy is None:
        strategy = get_strategy()
    return AmpHelper.from_strategy(strategy, device, group)


#: Why AMP on a CPU is warned about: a measurement (quick-start CNN, batch 32, 2-core CPU, torch 2.14).
CPU_AMP_NOTE = ("bfloat16 autocast on a CPU without fast bf16 kernels is usually slower than float32: the "
                "quick-start CNN measured 617 ms a step against 82 ms in float32 (7.5x) on a 2-core CPU")


def warn_cpu_amp(strategy: Any, device: torch.device) -> None:
    """Warn once per process when the strategy turns AMP on for a CPU device (see ``CPU_AMP_NOTE``)."""
    if strategy is not None and getattr(strategy, "amp", False) and device.type == "cpu":
        warn_once("cpu-amp", f"fleetlite: strategy.amp is on with a CPU device; {CPU_AMP_NOTE}. Use amp on GPUs, "
                             "or set strategy.amp=False (recipes: drop strategy=amp_bf16) unless you measured a gain")
