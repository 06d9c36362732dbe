"""The one table of ``DistributedStrategy``'s fields: Paddle's names, defaults and the check of each value.

:class:`~fleetlite.distributed.fleet.strategy.DistributedStrategy` validates
assignments with these checks, ``fleet.distributed_model`` applies the fields
marked as model fields, ``check_supported`` refuses what :data:`REFUSED` lists,
``save_to_prototxt`` writes Paddle's protobuf text format from it, and the
recipe's Hydra schema (:mod:`fleetlite.recipe.schema`) is generated from the
same table (``DistributedStrategy.field_table()``), so a field is declared once.

Scope: every collective (data/hybrid-parallel, dygraph) field of Paddle's
``DistributedStrategy`` and every key of its ``*_configs`` is here, with
Paddle's default (``distributed_strategy.proto``). Left out, so that setting
them is Paddle's ``TypeError`` for an unknown attribute:

============================  ================================================================================
kind                          Paddle fields
============================  ================================================================================
parameter server              ``a_sync``, ``a_sync_configs``, ``adam_d2sum``, ``sparse_table_configs``,
                              ``fleet_desc_configs``, ``fs_client_param``, ``downpour_table_param``,
                              ``trainer_desc_configs``, ``is_fl_ps_mode``, ``with_coordinator``, ``split_data``
heter                         ``heter_ccl_mode``, ``a_sync_configs['heter_worker_device_guard']``
static graph only             ``build_strategy``, ``execution_strategy``, ``sync_nccl_allreduce``,
                              ``nccl_comm_num``, ``use_hierarchical_allreduce``,
                              ``hierarchical_allreduce_inter_nranks``, ``fuse_grad_size_in_TFLOPS``,
                              ``fuse_grad_size_in_num``, ``fuse_grad_merge``, ``calc_comm_same_stream``,
                              ``gradient_scale_configs``, ``cudnn_exhaustive_search``,
                              ``conv_workspace_size_limit``, ``cudnn_batchnorm_spatial_persistent``, ``asp``,
                              ``qat``/``qat_configs``, ``mode``
auto parallel / elastic       ``auto``, ``semi_auto``, ``auto_search``, ``elastic`` (elastic restarts: torchrun's
                              ``--max-restarts`` through ``fleetlite launch``)
XPU                           ``FLAGS_*`` XPU switches; ``amp_configs['use_bf16_guard']`` style XPU-only keys
============================  ================================================================================

Example::

    from fleetlite.distributed.fleet.strategy_fields import FLAGS
    default, check, model_side = FLAGS["amp"]   # False, the bool check, applied by distributed_model
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["FLAGS", "CONFIGS", "REFUSED", "NO_EFFECT", "EXTRAS", "MESSAGE_LISTS", "StrategyTypeError",
           "UnknownFieldError"]

_Check = Callable[[str, Any], Any]


class StrategyTypeError(TypeError, ValueError):
    """A value of the wrong type. A ``TypeError`` as in Paddle (``fp16_allreduce = "True"``), and a ``ValueError``
    as fleetlite raised before: Paddle warns and ignores most wrongly typed values; fleetlite always refuses them."""


class UnknownFieldError(AttributeError, TypeError):
    """A name that is not a field: Paddle raises ``TypeError``; an ``AttributeError`` too, so ``hasattr`` works."""


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
        raise StrategyTypeError(f"{name} must be True or False, got {v!r} ({type(v).__name__})")
    return v


def _number(name: str, v: Any) -> int | float:
    if not _is_number(v):
        raise StrategyTypeError(f"{name} must be a number, got {v!r} ({type(v).__name__})")
    return v


@_typed(float)
def _positive(name: str, v: Any) -> int | float:
    if _number(name, v) <= 0:
        raise ValueError(f"{name} must be a positive number, got {v!r}")
    return v


@_typed(float)
def _non_negative(name: str, v: Any) -> float:
    if _number(name, v) < 0:
        raise ValueError(f"{name} must be a number >= 0, got {v!r}")
    return float(v)


def _int_at_least(low: int) -> _Check:
    @_typed(int)
    def check(name: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise StrategyTypeError(f"{name} must be an integer >= {low}, got {v!r} ({type(v).__name__})")
        if v < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        return v

    return check


@_typed(int)
def _any_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise StrategyTypeError(f"{name} must be an integer, got {v!r} ({type(v).__name__})")
    return v


@_typed(int)
def _degree(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise StrategyTypeError(f"{name} must be an integer, got {v!r} ({type(v).__name__})")
    if v < 1 and v != -1:
        raise ValueError(f"{name} must be -1 (fill the remaining ranks) or an integer >= 1, got {v!r}")
    return v


@_typed(int)
def _sharding_degree(name: str, v: Any) -> int:
    """-1 (fleetlite's "all ranks" before Paddle's default was adopted) is stored as that default, 8: same meaning."""
    return 8 if _degree(name, v) == -1 else v


@_typed(float)
def _ratio_above_one(name: str, v: Any) -> float:
    if _number(name, v) <= 1:
        raise ValueError(f"{name} must be a number > 1 (the scale grows by this factor), got {v!r}")
    return float(v)


@_typed(float)
def _ratio_below_one(name: str, v: Any) -> float:
    if not 0 < _number(name, v) < 1:
        raise ValueError(f"{name} must be a number in (0, 1) (the scale shrinks by this factor), got {v!r}")
    return float(v)


def _choice(*options: Any) -> _Check:
    @_typed(options)  # a tuple of the allowed values
    def check(name: str, v: Any) -> Any:
        if isinstance(v, bool) or v not in options:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {v!r}")
        return v

    return check


def _list_of(what: str, ok: Callable[[Any], bool], value_type: Any, convert: Callable[[Any], Any]) -> _Check:
    @_typed(value_type)
    def check(name: str, v: Any) -> list:
        if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
            raise StrategyTypeError(f"{name} must be a list of {what}, got {v!r} ({type(v).__name__})")
        if not all(ok(s) for s in v):
            raise ValueError(f"{name} must be a list of {what}, got {v!r}")
        return [convert(s) for s in v]

    return check


_names = _list_of("names (strings, e.g. ['layer1', 'layer2'])", lambda s: isinstance(s, str), list[str], str)
_fractions = _list_of("numbers in [0, 1)", lambda s: _is_number(s) and 0 <= s < 1, list[float], float)
_ints = _list_of("integers", lambda s: isinstance(s, int) and not isinstance(s, bool), list[int], int)

_AXES = ("dp", "pp", "sharding", "sep", "mp")

# Paddle's RefinedOpsPattern message (recompute_configs['refined_ops_patterns'] holds a list of them)
_PATTERN_KEYS = {"main_ops": [], "num": 0, "pre_ops": [], "suf_ops": []}


@_typed(list[dict[str, Any]])
def _ops_patterns(name: str, v: Any) -> list[dict[str, Any]]:
    """A list of Paddle's ``RefinedOpsPattern`` dicts (``main_ops``, ``num``, ``pre_ops``, ``suf_ops``); the keys
    left out get the proto's defaults, as protobuf fills them."""
    if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Sequence):
        raise StrategyTypeError(f"{name} must be a list of dicts with keys {list(_PATTERN_KEYS)}, got {v!r}")
    out = []
    for i, pattern in enumerate(v):
        if not isinstance(pattern, Mapping) or not set(pattern) <= set(_PATTERN_KEYS):
            raise ValueError(f"{name}[{i}] must be a dict with keys among {list(_PATTERN_KEYS)} (Paddle's "
                             f"RefinedOpsPattern), got {pattern!r}")
        full = {**_PATTERN_KEYS, **pattern}
        out.append({"main_ops": _names(f"{name}[{i}]['main_ops']", full["main_ops"]),
                    "num": _any_int(f"{name}[{i}]['num']", full["num"]),
                    "pre_ops": _names(f"{name}[{i}]['pre_ops']", full["pre_ops"]),
                    "suf_ops": _names(f"{name}[{i}]['suf_ops']", full["suf_ops"])})
    return out


@_typed(list[str])
def _order(name: str, v: Any) -> list[str]:
    axes = _names(name, v)
    if len(set(axes)) != len(axes) or not set(axes) <= set(_AXES):
        raise ValueError(f"{name} must list distinct axes among {list(_AXES)} (outermost first), got {v!r}")
    return axes


@_typed(("o1", "o2"))
def _level(name: str, v: Any) -> str:
    if not isinstance(v, str) or v.lower() not in ("o1", "o2"):
        raise ValueError(f"{name} must be 'o1' or 'o2' (Paddle's AMP levels; 'O1'/'O2' accepted), got {v!r}")
    return v.lower()


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
    "adaptive_localsgd": (False, _bool, _OTHER),
    "lars": (False, _bool, _OTHER),
    "lamb": (False, _bool, _OTHER),
    "pipeline": (False, _bool, _OTHER),
    "tensor_parallel": (False, _bool, _OTHER),
    "without_graph_optimization": (True, _bool, _OTHER),
}

# section -> key -> (default, check); a nested section (hybrid_configs' mp_configs, pp_configs) is a dict of its own.
CONFIGS: dict[str, dict[str, Any]] = {
    "amp_configs": {
        "init_loss_scaling": (32768.0, _positive),
        "incr_every_n_steps": (1000, _int_at_least(1)),
        "decr_every_n_nan_or_inf": (2, _int_at_least(1)),
        "incr_ratio": (2.0, _ratio_above_one),
        "decr_ratio": (0.8, _ratio_below_one),
        "use_dynamic_loss_scaling": (True, _bool),
        "custom_white_list": ([], _names),
        "custom_black_list": ([], _names),
        "custom_black_varnames": ([], _names),
        "use_pure_fp16": (False, _bool),
        "use_fp16_guard": (True, _bool),
        "use_optimizer_fp16": (False, _bool),
        "dtype": ("float16", _choice("float16", "bfloat16")),
        "level": ("o1", _level),
        "use_master_grad": (False, _bool),
        "use_pure_bf16": (False, _bool),  # Paddle 3.x
    },
    "recompute_configs": {"checkpoints": ([], _names), "enable_offload": (False, _bool),
                          "checkpoint_shape": ([], _ints), "enable_tuning": (False, _bool),
                          "refined_ops_patterns": ([], _ops_patterns)},
    "gradient_merge_configs": {"k_steps": (1, _int_at_least(1)), "avg": (True, _bool)},
    "fp16_allreduce_configs": {"dtype": ("float16", _choice("float16", "bfloat16"))},  # fleetlite's own section
    # Paddle's keys, then fleetlite's: stage 1 is ZeroRedundancyOptimizer, 2/3 FSDP2 (fleetlite.distributed.sharding);
    # next to mp/pp stage 2 is ZeroRedundancyOptimizer + owned gradients (meta_parallel/hybrid_sharding.py).
    # sharding_degree: ranks per sharding group (fewer than all = hybrid sharding); at Paddle's default 8 (a
    # static-graph default that Paddle's dygraph ignores) the group is hybrid_configs' sharding_degree, else all
    # ranks; -1 is stored as 8 (same meaning). For groups of exactly 8 use hybrid_configs' sharding_degree.
    # offload/wrap (fleetlite's): CPU offload and the module class names that become FSDP units.
    "sharding_configs": {
        "sharding_segment_strategy": ("segment_broadcast_MB", _choice("segment_broadcast_MB", "segment_anchors")),
        "segment_broadcast_MB": (32.0, _positive),
        "segment_anchors": ([], _names),
        "sharding_degree": (8, _sharding_degree),
        "mp_degree": (1, _int_at_least(1)),
        "dp_degree": (1, _int_at_least(1)),
        "hybrid_dp": (False, _bool),
        "gradient_merge_acc_step": (1, _int_at_least(1)),
        "optimize_offload": (False, _bool),
        "pp_allreduce_in_optimize": (False, _bool),
        "pp_degree": (1, _int_at_least(1)),
        "optimize_cast": (False, _bool),
        "_dp_as_optimizer_sharding": (False, _bool),
        "stage": (1, _choice(1, 2, 3)),
        "enable_tuning": (False, _bool),
        "use_calc_stream": (False, _bool),
        "offload": (False, _bool),
        "wrap": ([], _names),
    },
    "hybrid_configs": {
        "dp_degree": (-1, _degree),
        "mp_degree": (1, _int_at_least(1)),
        "pp_degree": (1, _int_at_least(1)),
        "sharding_degree": (1, _int_at_least(1)),
        "sep_degree": (1, _int_at_least(1)),
        "order": (list(_AXES), _order),  # Paddle keeps it as strategy.hybrid_parallel_order
        "mp_configs": {
            "sync_param": (False, _bool),
            "sync_grad": (False, _bool),
            "sync_moment": (False, _bool),
            "sync_mode": ("broadcast", _choice("broadcast", "average")),
            "sync_param_name": (["embedding", "layer_norm", ".b_"], _names),  # Paddle: strategy.sync_param_name
        },
        "pp_configs": {
            "dp_comm_overlap": (False, _bool),
            "delay_scale_loss": (False, _bool),
            "enable_timer": (False, _bool),
            "sharding_comm_overlap": (False, _bool),
            "profiling": (False, _bool),
            "release_gradients": (False, _bool),
            "overlap_p2p_comm": (False, _bool),
            "clear_every_step_cache": (False, _bool),
            "use_batch_p2p_comm": (True, _bool),
            "sync_param": (False, _bool),  # Paddle 3.x: shared weights across pipeline stages
            "sync_moment": (False, _bool),
            "sync_mode": ("broadcast", _choice("broadcast", "average")),
        },
    },
    "pipeline_configs": {
        "micro_batch_size": (1, _int_at_least(1)),
        "accumulate_steps": (1, _int_at_least(1)),
        "schedule_mode": ("1F1B", _choice("1F1B", "F-then-B", "FThenB", "VPP")),
        "p2p_cache_shape": (True, _bool),
        "enable_partial_send_recv": (True, _bool),
    },
    "tensor_parallel_configs": {"tensor_parallel_degree": (1, _int_at_least(1)), "tensor_init_seed": (-1, _any_int)},
    "dgc_configs": {
        "rampup_begin_step": (0, _int_at_least(0)),
        "rampup_step": (1, _int_at_least(1)),
        "sparsity": ([], _fractions),
    },
    "localsgd_configs": {"k_steps": (1, _int_at_least(1)), "begin_step": (1, _int_at_least(1))},
    "adaptive_localsgd_configs": {"init_k_steps": (1, _int_at_least(1)), "begin_step": (1, _int_at_least(1))},
    "lars_configs": {
        "lars_coeff": (0.001, _positive),
        "lars_weight_decay": (0.0005, _non_negative),
        "epsilon": (0.0, _non_negative),
        "exclude_from_weight_decay": ([], _names),
    },
    "lamb_configs": {"lamb_weight_decay": (0.01, _non_negative), "exclude_from_weight_decay": ([], _names)},
}

# Keys that hold a list of Paddle messages (a repeated message field): key -> the message's keys and defaults.
MESSAGE_LISTS = {"recompute_configs.refined_ops_patterns": _PATTERN_KEYS}

# Keys that are fleetlite's, not fields of Paddle's proto: save_to_prototxt writes them as ``# fleetlite:`` comment
# lines (Paddle's parser skips comments, fleetlite's reads them back), so a written file still loads in Paddle.
EXTRAS = frozenset({"fp16_allreduce_configs", "sharding_configs.offload", "sharding_configs.wrap",
                    "hybrid_configs.order", "hybrid_configs.mp_configs.sync_param_name"})


class Refusal(NamedTuple):
    what: str   # what the field asks for, and what to do instead
    later: bool  # True: planned, so the refusal is temporary


# Fields and keys fleetlite cannot honour (yet). ``check_supported`` raises NotImplementedError naming one when its
# value differs from Paddle's default -- for a ``<flag>_configs`` key only while its flag is on (Paddle ignores the
# configs of a feature that is off); hybrid_configs keys always. Never a silent no-op.
REFUSED: dict[str, Refusal] = {
    # hybrid_configs' mp_degree, pp_degree and sep_degree run (fleet/base/topology.py, fleet/meta_parallel/).
    # (lamb, lars, localsgd, adaptive_localsgd and dgc are applied by fleet.distributed_optimizer:
    # fleet/meta_optimizers/.)
    "pipeline": Refusal("static-graph pipeline parallelism; use hybrid_configs' pp_degree with a PipelineLayer", True),
    "tensor_parallel": Refusal("static-graph tensor parallelism; use hybrid_configs' mp_degree with "
                               "fleet.meta_parallel layers", True),
    # not planned:
    "amp_configs.use_pure_fp16": Refusal("Paddle's O2: parameters kept in half precision with fp32 master weights; "
                                         "set it to False to train with torch.autocast (O1)", False),
    "amp_configs.level": Refusal("Paddle's O2 (pure half precision); use 'o1' (torch.autocast)", False),
    "amp_configs.use_pure_bf16": Refusal("Paddle's pure bfloat16 (O2 in bfloat16: parameters kept in bfloat16); set "
                                         "amp_configs['dtype'] = 'bfloat16' to train with torch.autocast (O1)", False),
    "amp_configs.use_master_grad": Refusal("fp32 master gradients of O2; O1 keeps fp32 gradients anyway", False),
    "amp_configs.use_optimizer_fp16": Refusal("a half-precision optimizer state (auto parallel only in Paddle)", False),
    "amp_configs.custom_white_list": Refusal("per-op autocast lists: torch.autocast has fixed op lists; wrap a region "
                                             "in torch.autocast(enabled=False) to keep it in fp32", False),
    "amp_configs.custom_black_list": Refusal("per-op autocast lists: torch.autocast has fixed op lists; wrap a region "
                                             "in torch.autocast(enabled=False) to keep it in fp32", False),
    "amp_configs.custom_black_varnames": Refusal("per-variable autocast exclusions (static graph)", False),
    "recompute_configs.enable_offload": Refusal("offloading recompute checkpoints to the CPU", True),
    "recompute_configs.checkpoint_shape": Refusal("fixed checkpoint shapes (needed only with enable_offload)", True),
    "recompute_configs.refined_ops_patterns": Refusal("refined recompute (keeping the outputs of chosen ops inside a "
                                                      "recomputed segment)", False),
    "sharding_configs.sharding_segment_strategy": Refusal("static-graph broadcast segments; FSDP2/ZeRO segment "
                                                          "by module (sharding_configs['wrap'])", False),
    "sharding_configs.segment_broadcast_MB": Refusal("static-graph broadcast segments (see sharding_configs['wrap'])",
                                                     False),
    "sharding_configs.segment_anchors": Refusal("static-graph broadcast segments (see sharding_configs['wrap'])",
                                                False),
    "sharding_configs.mp_degree": Refusal("model parallelism inside sharding; set it to 1", True),
    "sharding_configs.pp_degree": Refusal("pipeline parallelism inside sharding; set it to 1", True),
    "sharding_configs.gradient_merge_acc_step": Refusal("sharding's own gradient merge; use strategy.gradient_merge "
                                                        "with gradient_merge_configs['k_steps']", False),
    "sharding_configs.optimize_offload": Refusal("offloading the optimizer state alone; sharding_configs['offload'] "
                                                 "offloads parameters, gradients and state (stage 2/3)", False),
    "sharding_configs.pp_allreduce_in_optimize": Refusal("a pipeline+sharding schedule option", True),
    "sharding_configs.optimize_cast": Refusal("static-graph cast optimisation", False),
    "sharding_configs._dp_as_optimizer_sharding": Refusal("static-graph data parallelism as ZeRO-1; use stage 1",
                                                          False),
}

# Fields accepted with no effect: Paddle's own eager (dygraph) mode ignores them too, or they only choose how Paddle
# communicates (the values computed are the same).
NO_EFFECT = {
    "without_graph_optimization": "a static-graph switch; eager (dygraph) training has no graph to optimise",
    "amp_configs.use_fp16_guard": "a static-graph O2 switch (fp16_guard regions); O2 is refused anyway",
    "recompute_configs.enable_tuning": "auto-parallel tuning of the recompute segments (static graph)",
    "sharding_configs.enable_tuning": "auto-parallel tuning of sharding (static graph)",
    "sharding_configs.use_calc_stream": "which CUDA stream Paddle's sharding communicates on",
    "pipeline_configs.enable_partial_send_recv": "Paddle's pipeline sends 1/mp of an activation and all-gathers it "
                                                 "on the next stage; the activation received is the same",
}
