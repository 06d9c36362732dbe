"""``DistributedStrategy``: Paddle's strategy object, validated on assignment.

Every collective field of Paddle's ``DistributedStrategy`` and every key of
its ``*_configs`` exists, with Paddle's name and default (the one table:
:mod:`~fleetlite.distributed.fleet.strategy_fields`, which also lists the
parameter-server, heter, static-graph and XPU fields left out). Flags are
plain attributes (``strategy.amp = True``); each ``*_configs`` attribute is a
mapping whose assignment *merges* the given keys into the current values
(Paddle's behaviour), and whose items can also be set one by one
(``strategy.amp_configs["dtype"] = "bfloat16"``) or read as attributes
(``strategy.hybrid_configs["mp_configs"].sync_param``).

Errors: an unknown attribute is Paddle's ``TypeError`` (also an
``AttributeError``), listing the valid names and the closest match; an unknown
config key is a ``KeyError``; a value of the wrong type is a ``TypeError`` (also
a ``ValueError``) and a value out of range a ``ValueError``, both at
assignment time -- stricter than Paddle, which prints a warning and ignores
most wrongly typed values.

Features that are named but not implemented here (:data:`strategy_fields.REFUSED`:
pipeline, tensor_parallel, pure fp16, ...) can be set, so a Paddle script's strategy builds, but
:meth:`DistributedStrategy.check_supported` (run by ``fleet.init`` and
``fleet.distributed_*``) refuses them with NotImplementedError naming the
field instead of ignoring them. ``save_to_prototxt`` / ``load_from_prototxt``
read and write Paddle's protobuf text format.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["DistributedStrategy"]

from . import strategy_configs as _cfg
from .plan import check_degrees, resolve_degrees
from .strategy_fields import CONFIGS, FLAGS, REFUSED, StrategyTypeError, UnknownFieldError

# Paddle's attributes that live inside hybrid_configs here: name -> key path
_ALIASES = {"hybrid_parallel_order": ("hybrid_configs", "order"),
            "sync_param_name": ("hybrid_configs", "mp_configs", "sync_param_name")}


class DistributedStrategy:
    """Paddle's ``fleet.DistributedStrategy``: which distributed features to use, and how.

    Example::

        from fleetlite.distributed import fleet
        strategy = fleet.DistributedStrategy()
        strategy.amp = True
        strategy.amp_configs = {"dtype": "bfloat16"}
        strategy.gradient_merge = True
        strategy.gradient_merge_configs = {"k_steps": 4}
        print(strategy)   # DistributedStrategy(amp=True, amp_configs={'dtype': 'bfloat16'}, ...)
        same = fleet.DistributedStrategy.from_dict(strategy.to_dict())
        assert same == strategy
    """

    def __init__(self, **fields: Any) -> None:
        object.__setattr__(self, "_values", {})
        for name, (default, *_) in FLAGS.items():
            self._values[name] = copy.deepcopy(default)
        for section, spec in CONFIGS.items():
            self._values[section] = _cfg.defaults(spec)
        for name, value in fields.items():
            setattr(self, name, value)

    # --- attribute access --------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        values = self.__dict__.get("_values", {})
        if name in CONFIGS:
            return _cfg.ConfigView(self, (name,))
        if name in values:
            return values[name]
        if name in _ALIASES:
            *path, key = _ALIASES[name]
            return _cfg.ConfigView(self, tuple(path))[key]
        raise UnknownFieldError(f"{name!r} is not an attribute of DistributedStrategy."
                                f"{_cfg.suggest(name, self.field_names())}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FLAGS:
            self._values[name] = FLAGS[name][1](name, value)
        elif name in CONFIGS:
            self._set_config((name,), value)
        elif name in _ALIASES:
            *path, key = _ALIASES[name]
            self._set_config(tuple(path), {key: value})
        else:
            raise UnknownFieldError(f"{name!r} is not an attribute of DistributedStrategy."
                                    f"{_cfg.suggest(name, self.field_names())}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"DistributedStrategy fields cannot be deleted; assign the default to reset {name!r}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.field_names()) | set(_ALIASES))

    def _set_config(self, path: tuple[str, ...], updates: Any) -> None:
        """Merge ``updates`` into the section at ``path`` (nested sections merge too), all or nothing."""
        name = path[0] + "".join(f"[{k!r}]" for k in path[1:])
        merged = copy.deepcopy(_cfg.ConfigView(self, path)._data)
        self._merge(name, _cfg.spec_at(path), merged, updates)  # validate everything before changing anything
        section = self._values[path[0]]
        for key in path[1:-1]:
            section = section[key]
        if len(path) == 1:
            self._values[path[0]] = merged
        else:
            section[path[-1]] = merged

    @staticmethod
    def _merge(name: str, spec: Mapping[str, Any], into: dict[str, Any], updates: Any) -> None:
        if not isinstance(updates, Mapping):
            example = {k: e[0] for k, e in list(spec.items())[:1] if not isinstance(e, dict)}
            raise StrategyTypeError(f"{name} must be a dict of settings (e.g. {example}), got {updates!r}")
        for key, value in updates.items():
            if key not in spec:
                raise KeyError(f"{name} has no key {key!r}.{_cfg.suggest(str(key), list(spec))}")
            if isinstance(spec[key], dict):
                DistributedStrategy._merge(f"{name}[{key!r}]", spec[key], into[key], value)
            else:
                into[key] = spec[key][1](f"{name}[{key!r}]", value)

    # --- conversion ----------------------------------------------------------------------------------------
    @staticmethod
    def field_names() -> list[str]:
        """All attribute names, flags then ``*_configs`` sections."""
        return list(FLAGS) + list(CONFIGS)

    @staticmethod
    def model_field_names() -> list[str]:
        """The fields ``distributed_model`` applies to the model: model-side flags and their ``*_configs``."""
        flags = [name for name, (*_, model) in FLAGS.items() if model]
        return [f for name in flags for f in (name, f"{name}_configs") if f in FLAGS or f in CONFIGS]

    @staticmethod
    def field_table() -> dict[str, Any]:
        """Every field as ``(value type, default)``; a ``*_configs`` section as a dict of its keys' pairs.

        The value type is ``bool``, ``int``, ``float``, ``list[str]``, ``list[int]``, ``list[float]``, or a tuple of
        the allowed values; a nested section (``hybrid_configs``' ``mp_configs``) is a dataclass and its default
        instance. Order: each flag followed by its section, then the remaining sections. The recipe's ``strategy``
        schema is generated from this table.
        """
        def section_table(spec: Mapping[str, Any]) -> dict[str, Any]:
            return {k: _cfg.nested_schema(k, e) if isinstance(e, dict)
                    else (e[1].value_type, copy.deepcopy(e[0])) for k, e in spec.items()}

        table: dict[str, Any] = {}
        for name, (default, check, _) in FLAGS.items():
            table[name] = (check.value_type, copy.deepcopy(default))
            if f"{name}_configs" in CONFIGS:
                table[f"{name}_configs"] = section_table(CONFIGS[f"{name}_configs"])
        for section, spec in CONFIGS.items():
            if section not in table:
                table[section] = section_table(spec)
        return table

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain python values (configs as nested dicts)."""
        return copy.deepcopy(self._values)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> DistributedStrategy:
        """Build a strategy from a (possibly partial, possibly OmegaConf) mapping; missing fields keep defaults."""
        if data is None:
            return cls()
        if isinstance(data, DistributedStrategy):
            return copy.deepcopy(data)
        if not isinstance(data, Mapping):
            raise StrategyTypeError(f"DistributedStrategy.from_dict needs a mapping of field names to values, got "
                                    f"{type(data).__name__}")
        strategy = cls()
        for name, value in data.items():
            setattr(strategy, str(name), value)
        return strategy

    def save_to_prototxt(self, output: str) -> None:
        """Write the strategy to ``output`` in Paddle's protobuf text format (``paddle``'s
        ``load_from_prototxt`` reads it; fleetlite's own keys go in ``# fleetlite:`` comment lines)."""
        from .prototxt import dumps

        with open(output, "w", encoding="utf-8") as f:
            f.write(dumps(self))

    def load_from_prototxt(self, pb_file: str) -> None:
        """Merge the fields of a protobuf text file (one Paddle's ``save_to_prototxt`` wrote) into this strategy."""
        from .prototxt import loads

        with open(pb_file, encoding="utf-8") as f:
            loads(f.read(), self)

    def diff(self) -> dict[str, Any]:
        """The fields (and config keys) that differ from the defaults."""
        out: dict[str, Any] = {}
        for name, (default, *_) in FLAGS.items():
            if self._values[name] != default:
                out[name] = self._values[name]
        for section, spec in CONFIGS.items():
            changed = _cfg.diff(self._values[section], spec)
            if changed:
                out[section] = changed
        return out

    def __repr__(self) -> str:
        return f"DistributedStrategy({', '.join(f'{k}={v!r}' for k, v in self.diff().items())})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DistributedStrategy):
            return NotImplemented
        return self._values == other._values

    __hash__ = None  # mutable

    def __deepcopy__(self, memo: dict) -> DistributedStrategy:
        new = DistributedStrategy()
        object.__setattr__(new, "_values", copy.deepcopy(self._values, memo))
        return new

    def __getstate__(self) -> dict[str, Any]:
        return {"_values": self._values}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "_values", state["_values"])

    # --- what this implementation runs ----------------------------------------------------------------------
    @property
    def sharding_enabled(self) -> bool:
        """True when optimizer-state sharding is asked for.

        That is ``sharding`` or ``hybrid_configs['sharding_degree'] > 1``.
        """
        return self._values["sharding"] or self._values["hybrid_configs"]["sharding_degree"] > 1

    @property
    def sharding_stage(self) -> int:
        """0 without sharding, else ``sharding_configs['stage']`` (1, 2 or 3)."""
        return self._values["sharding_configs"]["stage"] if self.sharding_enabled else 0

    def sharding_degree(self, world_size: int) -> int:
        """Ranks per sharding group: ``sharding_configs['sharding_degree']``, else ``hybrid_configs``', else all.

        ``sharding_configs['sharding_degree']`` at Paddle's default, 8 (a static-graph default that Paddle's dygraph
        ignores; -1 is stored as 8), means "not given here": the group is then ``hybrid_configs['sharding_degree']``
        when above 1, else all ranks. For sharding groups of exactly 8 ranks set ``hybrid_configs['sharding_degree']``.
        """
        sd = self._values["sharding_configs"]["sharding_degree"]
        if sd == CONFIGS["sharding_configs"]["sharding_degree"][0]:
            sd = self._values["hybrid_configs"]["sharding_degree"]
            sd = world_size if sd <= 1 else sd
        return sd

    def _check_sharding(self, sd: int, world_size: int) -> None:
        stage, cfg = self._values["sharding_configs"]["stage"], self._values["sharding_configs"]
        if sd > world_size or world_size % sd:
            raise ValueError(f"sharding degree {sd} does not divide the {world_size} ranks: set "
                             f"sharding_configs['sharding_degree'] to a divisor of {world_size} (the ranks of one "
                             "node for hybrid sharding) or -1 for all ranks")
        hsd = self._values["hybrid_configs"]["sharding_degree"]
        if stage == 1 and sd != world_size and not sd == hsd > 1:
            # (hybrid_configs' sharding axis runs stage 1 in groups: Note [sharding with mp and pp])
            raise NotImplementedError(
                f"sharding degree {sd} with {world_size} ranks at stage 1 from sharding_configs: hybrid (partial) "
                f"stage 1 runs over hybrid_configs' sharding axis; set hybrid_configs['sharding_degree'] = {sd} "
                f"(dp_degree {world_size // sd}), or use stage 2 or 3 (FSDP2 on a 2-D DeviceMesh)")
        if stage == 1 and (cfg["offload"] or cfg["wrap"]):
            raise NotImplementedError(
                "sharding_configs offload/wrap apply to stages 2 and 3 (FSDP2); stage 1 "
                "(ZeroRedundancyOptimizer) shards only the optimizer state: set stage 2 or 3, or drop them")
        if stage > 1 and (self._values["fp16_allreduce"] and self._values["amp"]
                          and self._values["fp16_allreduce_configs"]["dtype"] != self._values["amp_configs"]["dtype"]):
            raise ValueError("under sharding stage 2/3 fp16_allreduce's dtype is FSDP's reduce dtype and amp's is its "
                             "parameter dtype: set both to the same dtype, or turn fp16_allreduce off")
        replicas = world_size // sd
        if cfg["dp_degree"] not in (1, replicas):  # Paddle's static sharding: sharding_degree * dp_degree = world
            raise ValueError(f"sharding_configs['dp_degree'] = {cfg['dp_degree']} does not fit {world_size} ranks in "
                             f"sharding groups of {sd}: set it to {replicas} or leave it at 1 (computed)")
        if cfg["hybrid_dp"] and replicas == 1:
            raise ValueError(f"sharding_configs['hybrid_dp'] = True needs more than one sharding group, but the "
                             f"sharding degree {sd} spans all {world_size} ranks: set sharding_degree to a divisor "
                             f"of {world_size} (the ranks of one node) or hybrid_dp = False")

    def _check_hybrid_sharding(self) -> None:
        """Sharding next to mp/pp: stages 1 and 2 over hybrid_configs' sharding axis (Notes [sharding with mp and pp],
        [hybrid sharding stage 2]); stage 3 on FSDP2 over dp x sharding beside mp, beside pp or beside both (Notes
        [stage 3 beside mp], [stage 3 beside pp]), not beside sep."""
        hybrid, cfg = self._values["hybrid_configs"], self._values["sharding_configs"]
        stage, hsd = cfg["stage"], hybrid["sharding_degree"]
        if stage == 3 and hybrid["sep_degree"] > 1:
            raise NotImplementedError(
                "sharding stage 3 together with sep_degree > 1 is not implemented by fleetlite (stage 3 runs beside "
                "mp_degree and pp_degree > 1: FSDP2 over dp x sharding); set sharding_configs['stage'] = 2 "
                "(optimizer state and gradients sharded over hybrid_configs' sharding axis) or 1 (optimizer state "
                "only), or sep_degree = 1")
        if stage == 2 and self._values["fp16_allreduce"]:
            raise NotImplementedError(
                "fp16_allreduce with sharding stage 2 next to mp_degree/pp_degree > 1: the reduction to each "
                "gradient's owner (Note [hybrid sharding stage 2]) runs in the gradients' dtype; turn fp16_allreduce "
                "off, or use sharding stage 1")
        if hsd == 1:
            raise ValueError(
                "strategy.sharding with mp_degree/pp_degree > 1 shards over hybrid_configs' sharding axis, but "
                "hybrid_configs['sharding_degree'] is 1: set it to the number of ranks to shard the optimizer "
                "state across (they split the data like dp_degree, e.g. {'dp_degree': 1, 'mp_degree': 2, "
                "'sharding_degree': 2}), or turn sharding off")
        sd = cfg["sharding_degree"]
        if sd != CONFIGS["sharding_configs"]["sharding_degree"][0] and sd != hsd:
            raise ValueError(
                f"sharding_configs['sharding_degree'] = {sd} but hybrid_configs['sharding_degree'] = {hsd}; with "
                "mp_degree/pp_degree > 1 the sharding group is hybrid_configs' axis: drop sharding_configs' "
                f"sharding_degree (or set it to {hsd})")
        if cfg["offload"] or (cfg["wrap"] and stage != 3):
            raise NotImplementedError(
                "sharding_configs offload/wrap apply to FSDP2 (stages 2 and 3 without mp/pp; wrap also to stage 3 "
                "beside mp); with mp_degree/pp_degree > 1 stages 1 and 2 shard over hybrid_configs' sharding axis "
                "without FSDP2: drop them")
        if cfg["dp_degree"] != 1 or cfg["hybrid_dp"]:
            raise ValueError(
                "sharding_configs['dp_degree'] / ['hybrid_dp'] are static-graph sharding's replicas; with "
                "mp_degree/pp_degree > 1 set hybrid_configs['dp_degree'] instead and leave them at 1 / False")

    def _refused(self) -> tuple[str, Any, Any] | None:
        """The first REFUSED field or key that is turned on: ``(path, value, Refusal)``, else None."""
        for path, refusal in REFUSED.items():
            section, _, key = path.partition(".")
            if not key:
                value, default = self._values[section], FLAGS[section][0]
            else:
                flag = section.removesuffix("_configs")
                if flag in FLAGS and not self._values[flag]:
                    continue  # Paddle ignores the configs of a feature that is off
                value, default = self._values[section][key], CONFIGS[section][key][0]
            if value != default:
                return path, value, refusal
        return None

    def check_supported(self, world_size: int) -> None:
        """Raise NotImplementedError for a feature this implementation does not run, ValueError for degrees
        that do not fit ``world_size``. Called by ``fleet.init`` and ``fleet.distributed_*``."""
        refused = self._refused()
        if refused:
            path, value, refusal = refused
            section, _, key = path.partition(".")
            name = f"strategy.{section}" + (f"[{key!r}]" if key else "")
            default = FLAGS[section][0] if not key else CONFIGS[section][key][0]
            when = " (yet)" if refusal.later else ""
            raise NotImplementedError(
                f"{name} = {value!r} ({refusal.what}) is not implemented by fleetlite{when}; set {name} = "
                f"{default!r}. fleetlite runs data parallelism with amp, recompute, gradient_merge, sync_batch_norm, "
                "fp16_allreduce, sharding stages 1-3, lamb, lars, localsgd, adaptive_localsgd and dgc.")
        hybrid = self._values["hybrid_configs"]
        beside = [f"{k}={hybrid[k]}" for k in ("pp_degree", "sharding_degree") if hybrid[k] > 1]
        if hybrid["sep_degree"] > 1 and (beside or self.sharding_enabled):  # meta_parallel/segment_parallel.py
            raise NotImplementedError(
                f"hybrid_configs['sep_degree'] = {hybrid['sep_degree']} beside {', '.join(beside) or 'sharding'} is "
                "not implemented by fleetlite (yet): segment parallelism runs with dp_degree and mp_degree; set the "
                "others to 1 (and strategy.sharding = False)")
        model = hybrid["mp_degree"] * hybrid["pp_degree"] * hybrid["sep_degree"]
        if self.sharding_enabled and model > 1:  # (hsd > 1 turns sharding on)
            self._check_hybrid_sharding()
        elif self.sharding_enabled:
            self._check_sharding(self.sharding_degree(world_size), world_size)
        check_degrees(hybrid, world_size)  # the plan's checks (plan.py)

    def hybrid_degrees(self, world_size: int) -> dict[str, int]:
        """The degree of each hybrid axis (``dp``, ``pp``, ``sharding``, ``sep``, ``mp``), ``dp_degree=-1`` resolved:
        the parallel plan's degrees (``fleet.get_parallel_plan().degrees`` after ``fleet.init``).

        Example::

            DistributedStrategy(hybrid_configs={"mp_degree": 2}).hybrid_degrees(4)["dp"]   # 2
        """
        return resolve_degrees(self._values["hybrid_configs"], world_size)
