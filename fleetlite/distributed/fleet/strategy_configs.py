"""The pieces of :class:`~fleetlite.distributed.fleet.strategy.DistributedStrategy` that walk its config sections:
defaults, differences, the recipe-schema form of nested sections, and the live ``*_configs`` view."""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import field as dc_field
from dataclasses import make_dataclass
from typing import Any

from .strategy_fields import CONFIGS

__all__ = ["ConfigView", "suggest", "defaults", "spec_at", "diff", "nested_schema"]


def suggest(name: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{hint} Valid names: {', '.join(valid)}."


def defaults(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: defaults(e) if isinstance(e, dict) else copy.deepcopy(e[0]) for k, e in spec.items()}


def spec_at(path: Sequence[str]) -> dict[str, Any]:
    spec = CONFIGS[path[0]]
    for key in path[1:]:
        spec = spec[key]
    return spec


def diff(values: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, entry in spec.items():
        if isinstance(entry, dict):
            sub = diff(values[key], entry)
            if sub:
                out[key] = sub
        elif values[key] != entry[0]:
            out[key] = values[key]
    return out


def nested_schema(name: str, spec: Mapping[str, Any]) -> tuple[type, Any]:
    """A nested section as a ``(dataclass, instance)`` pair for the recipe's schema generator, which reads one
    level of ``(type, default)`` pairs per section. The instance's class is hashable so it may be a default."""
    fields = []
    for key, (default, check) in spec.items():
        value_type = check.value_type
        if isinstance(value_type, tuple):
            value_type = type(value_type[0])
        fields.append((key, value_type, dc_field(default_factory=lambda d=default: copy.deepcopy(d))))
    cls = make_dataclass("".join(p.capitalize() for p in name.split("_")), fields, unsafe_hash=True)
    return cls, cls()


class ConfigView(MutableMapping):
    """A live view of one ``*_configs`` section (or a nested one, e.g. ``hybrid_configs['mp_configs']``): item
    assignment is validated and written through; keys can also be read as attributes, as on Paddle's messages."""

    def __init__(self, owner: Any, path: tuple[str, ...]):
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_path", path)

    @property
    def _name(self) -> str:
        return self._path[0] + "".join(f"[{k!r}]" for k in self._path[1:])

    @property
    def _data(self) -> dict[str, Any]:
        data = self._owner._values[self._path[0]]
        for key in self._path[1:]:
            data = data[key]
        return data

    def __getitem__(self, key: str) -> Any:
        if key not in self._data:
            raise KeyError(f"{self._name} has no key {key!r}.{suggest(str(key), list(self._data))}")
        if isinstance(self._data[key], dict):
            return ConfigView(self._owner, (*self._path, key))
        return self._data[key]

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(e.args[0]) from None

    def __setitem__(self, key: str, value: Any) -> None:
        self._owner._set_config(self._path, {key: value})

    def __delitem__(self, key: str) -> None:
        raise TypeError(f"{self._name} keys cannot be deleted; assign the default to reset {key!r}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)
