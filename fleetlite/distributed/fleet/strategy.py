"""``DistributedStrategy``: Paddle's strategy object, validated on assignment.

Every field has Paddle's name and default. Flags are plain attributes
(``strategy.amp = True``); each ``*_configs`` attribute is a mapping whose
assignment *merges* the given keys into the current values (Paddle's
behaviour), and whose items can also be set one by one
(``strategy.amp_configs["dtype"] = "bfloat16"``). A wrong name raises
AttributeError/KeyError with the valid names and the closest match; a wrong
type or value raises ValueError naming the field, at assignment time.

Features that are named but not implemented here (dgc, localsgd, pipeline,
tensor_parallel, mp/pp degrees above 1, pure fp16) can be set,
so a Paddle script's strategy builds, but :meth:`DistributedStrategy.check_supported`
(run by ``fleet.init`` and ``fleet.distributed_*``) refuses them with
NotImplementedError instead of ignoring them.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["DistributedStrategy"]

from .strategy_fields import CONFIGS, FLAGS, UNSUPPORTED


def _suggest(name: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{hint} Valid names: {', '.join(valid)}."


class _ConfigView(MutableMapping):
    """A live view of one ``*_configs`` section: item assignment is validated and written through."""

    def __init__(self, owner: DistributedStrategy, section: str):
        self._owner = owner
        self._section = section

    @property
    def _data(self) -> dict[str, Any]:
        return self._owner._values[self._section]

    def __getitem__(self, key: str) -> Any:
        if key not in self._data:
            raise KeyError(f"{self._section} has no key {key!r}.{_suggest(str(key), list(self._data))}")
        return self._data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._owner._set_config(self._section, {key: value})

    def __delitem__(self, key: str) -> None:
        raise TypeError(f"{self._section} keys cannot be deleted; assign the default "
                        f"({CONFIGS[self._section].get(key, (None,))[0]!r}) to reset {key!r}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)


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
            self._values[section] = {k: copy.deepcopy(d) for k, (d, _) in spec.items()}
        for name, value in fields.items():
            setattr(self, name, value)

    # --- attribute access --------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        values = self.__dict__.get("_values", {})
        if name in CONFIGS:
            return _ConfigView(self, name)
        if name in values:
            return values[name]
        raise AttributeError(f"DistributedStrategy has no attribute {name!r}.{_suggest(name, self.field_names())}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FLAGS:
            self._values[name] = FLAGS[name][1](name, value)
        elif name in CONFIGS:
            if not isinstance(value, Mapping):
                example = dict(list(self._values[name].items())[:1])
                raise ValueError(f"{name} must be a dict of settings (e.g. {example}), got {value!r}")
            self._set_config(name, value)
        else:
            raise AttributeError(f"DistributedStrategy has no attribute {name!r}."
                                 f"{_suggest(name, self.field_names())}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"DistributedStrategy fields cannot be deleted; assign the default to reset {name!r}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.field_names()))

    def _set_config(self, section: str, updates: Mapping[str, Any]) -> None:
        spec = CONFIGS[section]
        checked = {}
        for key, value in updates.items():  # validate everything before changing anything
            if key not in spec:
                raise KeyError(f"{section} has no key {key!r}.{_suggest(str(key), list(spec))}")
            checked[key] = spec[key][1](f"{section}[{key!r}]", value)
        self._values[section].update(checked)

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

        The value type is ``bool``, ``int``, ``float``, ``list[str]``, ``list[float]``, or a tuple of the
        allowed values. Order: each flag followed by its section, then the remaining sections. The recipe's
        ``strategy`` schema is generated from this table.
        """
        table: dict[str, Any] = {}
        for name, (default, check, _) in FLAGS.items():
            table[name] = (check.value_type, copy.deepcopy(default))
            if f"{name}_configs" in CONFIGS:
                section = f"{name}_configs"
                table[section] = {k: (c.value_type, copy.deepcopy(d)) for k, (d, c) in CONFIGS[section].items()}
        for section, spec in CONFIGS.items():
            if section not in table:
                table[section] = {k: (c.value_type, copy.deepcopy(d)) for k, (d, c) in spec.items()}
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
            raise ValueError(f"DistributedStrategy.from_dict needs a mapping of field names to values, got "
                             f"{type(data).__name__}")
        strategy = cls()
        for name, value in data.items():
            setattr(strategy, str(name), value)
        return strategy

    def diff(self) -> dict[str, Any]:
        """The fields (and config keys) that differ from the defaults."""
        out: dict[str, Any] = {}
        for name, (default, *_) in FLAGS.items():
            if self._values[name] != default:
                out[name] = self._values[name]
        for section, spec in CONFIGS.items():
            changed = {k: v for k, v in self._values[section].items() if v != spec[k][0]}
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
        """Ranks per sharding group: ``sharding_configs['sharding_degree']``, else ``hybrid_configs``', else all."""
        sd = self._values["sharding_configs"]["sharding_degree"]
        if sd == -1:
            sd = self._values["hybrid_configs"]["sharding_degree"]
            sd = world_size if sd <= 1 else sd
        return sd

    def _check_sharding(self, sd: int, world_size: int) -> None:
        stage, cfg = self._values["sharding_configs"]["stage"], self._values["sharding_configs"]
        if sd > world_size or world_size % sd:
            raise ValueError(f"sharding degree {sd} does not divide the {world_size} ranks: set "
                             f"sharding_configs['sharding_degree'] to a divisor of {world_size} (the ranks of one "
                             "node for hybrid sharding) or -1 for all ranks")
        if stage == 1 and sd != world_size:
            raise NotImplementedError(
                f"sharding degree {sd} with {world_size} ranks at stage 1: hybrid (partial) sharding runs on stages "
                f"2/3 (FSDP2 on a 2-D DeviceMesh); use stage 2 or 3, or sharding_degree = {world_size} (all ranks)")
        if stage == 1 and (cfg["offload"] or cfg["wrap"]):
            raise NotImplementedError(
                "sharding_configs offload/wrap apply to stages 2 and 3 (FSDP2); stage 1 "
                "(ZeroRedundancyOptimizer) shards only the optimizer state: set stage 2 or 3, or drop them")
        if stage > 1 and (self._values["fp16_allreduce"] and self._values["amp"]
                          and self._values["fp16_allreduce_configs"]["dtype"] != self._values["amp_configs"]["dtype"]):
            raise ValueError("under sharding stage 2/3 fp16_allreduce's dtype is FSDP's reduce dtype and amp's is its "
                             "parameter dtype: set both to the same dtype, or turn fp16_allreduce off")

    def check_supported(self, world_size: int) -> None:
        """Raise NotImplementedError for a feature this implementation does not run, ValueError for degrees
        that do not fit ``world_size``. Called by ``fleet.init`` and ``fleet.distributed_*``."""
        for name, what in UNSUPPORTED.items():
            if self._values[name]:
                raise NotImplementedError(
                    f"strategy.{name} = True ({what}) is not implemented by fleetlite; set strategy.{name} = False. "
                    "fleetlite runs data parallelism with amp, recompute, gradient_merge, sync_batch_norm, "
                    "fp16_allreduce and sharding stages 1-3.")
        hybrid = self._values["hybrid_configs"]
        for key in ("mp_degree", "pp_degree"):
            if hybrid[key] > 1:
                raise NotImplementedError(
                    f"hybrid_configs['{key}'] = {hybrid[key]}: model/pipeline parallelism is not implemented by "
                    f"fleetlite; set it to 1 (data parallelism, optionally with sharding).")
        sd, dp = self.sharding_degree(world_size), hybrid["dp_degree"]
        if self.sharding_enabled:
            self._check_sharding(sd, world_size)
        hsd = hybrid["sharding_degree"]  # Paddle's dp_degree counts the replicas of a hybrid_configs sharding group
        expected_dp = world_size // hsd if hsd > 1 else world_size
        if dp != -1 and dp != expected_dp:
            raise ValueError(
                f"hybrid_configs['dp_degree'] = {dp} does not fit {world_size} ranks (sharding_degree {hsd}): "
                f"it must be {expected_dp} or -1 (computed).")
        if self._values["amp"] and self._values["amp_configs"]["use_pure_fp16"]:
            raise NotImplementedError(
                "amp_configs['use_pure_fp16'] = True (Paddle's O2: parameters kept in half precision with fp32 "
                "master weights) is not implemented; set it to False to train with torch.autocast (O1).")
