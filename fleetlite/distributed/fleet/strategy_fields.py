"""The one table of ``DistributedStrategy``'s fields: Paddle's names, defaults and the check of each value.

:class:`~fleetlite.distributed.fleet.strategy.DistributedStrategy` validates
assignments with these checks, ``fleet.distributed_model`` applies the fields
marked as model fields, and the recipe's Hydra schema
(:mod:`fleetlite.recipe.schema`) is generated from the same table
(``DistributedStrategy.field_table()``), so a field is declared once.

Example::

    from fleetlite.distributed.fleet.strategy_fields import FLAGS
    default, check, model_side = FLAGS["amp"]   # False, the bool check, applied by distributed_model
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["FLAGS", "CONFIGS", "UNSUPPORTED"]

_Check = Callable[[str, Any], Any]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _typed(value_type: Any) -> Callable[[_Check], _Check]:
    """Record the type of value a check accepts (``check.value_type``): the recipe schema is generated from it."""
    def mark(check: _Check) -> _Check:
        check.value_type = value_type
        return check

    return mark


@_typed(bool)
def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be True or False, got {v!r} ({type(v).__name__})")
    return v


@_typed(float)
def _positive(name: str, v: Any) -> int | float:
    if not _is_number(v) or v <= 0:
        raise ValueError(f"{name} must be a positive number, got {v!r}")
    return v


def _int_at_least(low: int) -> _Check:
    @_typed(int)
    def check(name: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        return v

    return check


@_typed(int)
def _degree(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1):
        raise ValueError(f"{name} must be -1 (fill the remaining ranks) or an integer >= 1, got {v!r}")
    return v


@_typed(float)
def _ratio_above_one(name: str, v: Any) -> float:
    if not _is_number(v) or v <= 1:
        raise ValueError(f"{name} must be a number > 1 (the scale grows by this factor), got {v!r}")
    return float(v)


@_typed(float)
def _ratio_below_one(name: str, v: Any) -> float:
    if not _is_number(v) or not 0 < v < 1:
        raise ValueError(f"{name} must be a number in (0, 1) (the scale shrinks by this factor), got {v!r}")
    return float(v)


def _choice(*options: Any) -> _Check:
    @_typed(options)  # a tuple of the allowed values
    def check(name: str, v: Any) -> Any:
        if isinstance(v, bool) or v not in options:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {v!r}")
        return v

    return check


@_typed(list[str])
def _names(name: str, v: Any) -> list[str]:
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or not all(isinstance(s, str) for s in v):
        raise ValueError(f"{name} must be a list of submodule names (strings, e.g. ['layer1', 'layer2']), "
                         f"got {v!r}")
    return list(v)


@_typed(list[float])
def _fractions(name: str, v: Any) -> list[float]:
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or not all(
            _is_number(s) and 0 <= s < 1 for s in v):
        raise ValueError(f"{name} must be a list of numbers in [0, 1), got {v!r}")
    return [float(s) for s in v]


# The one table of the strategy's fields (the recipe's schema, fleetlite.recipe.schema, is generated from it).
# name -> (default, check, applied to the model): "model" fields (and their ``<name>_configs`` section) are applied
# by ``distributed_model``, so a later strategy cannot change them on an already wrapped model; the others act in
# the optimizer (gradient_merge) or are refused by check_supported. Order is the order of to_dict() and repr().
_MODEL, _OTHER = True, False
FLAGS: dict[str, tuple[Any, _Check, bool]] = {
    "find_unused_parameters": (False, _bool, _MODEL),
    "fuse_all_reduce_ops": (True, _bool, _MODEL),
    "fuse_grad_size_in_MB": (32, _positive, _MODEL),
    "last_comm_group_size_MB": (1, _positive, _MODEL),
    "amp": (False, _bool, _MODEL),
    "recompute": (False, _bool, _MODEL),
    "gradient_merge": (False, _bool, _OTHER),
    "sync_batch_norm": (False, _bool, _MODEL),
    "fp16_allreduce": (False, _bool, _MODEL),
    "sharding": (False, _bool, _MODEL),
    "dgc": (False, _bool, _OTHER),
    "localsgd": (False, _bool, _OTHER),
    "pipeline": (False, _bool, _OTHER),
    "tensor_parallel": (False, _bool, _OTHER),
}

CONFIGS: dict[str, dict[str, tuple[Any, _Check]]] = {
    "amp_configs": {
        "init_loss_scaling": (32768.0, _positive),
        "incr_every_n_steps": (1000, _int_at_least(1)),
        "decr_every_n_nan_or_inf": (2, _int_at_least(1)),
        "incr_ratio": (2.0, _ratio_above_one),
        "decr_ratio": (0.8, _ratio_below_one),
        "use_dynamic_loss_scaling": (True, _bool),
        "use_pure_fp16": (False, _bool),
        "dtype": ("float16", _choice("float16", "bfloat16")),
    },
    "recompute_configs": {"checkpoints": ([], _names)},
    "gradient_merge_configs": {"k_steps": (1, _int_at_least(1)), "avg": (True, _bool)},
    "fp16_allreduce_configs": {"dtype": ("float16", _choice("float16", "bfloat16"))},
    # stage 1: ZeroRedundancyOptimizer; 2/3: FSDP2 (fleetlite.distributed.sharding); sharding_degree -1 = all
    # ranks, fewer = hybrid sharding; wrap: module class names that become FSDP units (default: automatic)
    "sharding_configs": {"stage": (1, _choice(1, 2, 3)), "sharding_degree": (-1, _degree),
                         "offload": (False, _bool), "wrap": ([], _names)},
    "hybrid_configs": {
        "dp_degree": (-1, _degree),
        "mp_degree": (1, _int_at_least(1)),
        "pp_degree": (1, _int_at_least(1)),
        "sharding_degree": (1, _int_at_least(1)),
    },
    "dgc_configs": {
        "rampup_begin_step": (0, _int_at_least(0)),
        "rampup_step": (1, _int_at_least(1)),
        "sparsity": ([0.999], _fractions),
    },
    "localsgd_configs": {"k_steps": (1, _int_at_least(1)), "begin_step": (1, _int_at_least(1))},
}

UNSUPPORTED = {
    "dgc": "deep gradient compression",
    "localsgd": "local SGD",
    "pipeline": "pipeline parallelism",
    "tensor_parallel": "tensor (model) parallelism",
}
