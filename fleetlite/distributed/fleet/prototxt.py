"""``DistributedStrategy`` in Paddle's protobuf text format (``save_to_prototxt`` / ``load_from_prototxt``).

Paddle writes ``str(strategy_pb2)``: one ``name: value`` line per set scalar,
one line per element of a repeated field, ``name { ... }`` for a nested
message, two-space indents, strings in double quotes with C escapes,
``true``/``false``, enum values by name. This module writes that format for
the fields that differ from Paddle's defaults, and reads any text-format file
(comments, ``<...>`` blocks, ``[a, b]`` lists and single quotes included)
without protobuf. fleetlite's own keys (:data:`strategy_fields.EXTRAS`) are
written as ``# fleetlite: section.key: value`` comment lines, which Paddle's
parser skips and this reader applies, so a file written here loads in Paddle
and back here unchanged. Fields of Paddle's strategy that fleetlite leaves out
(parameter server, static graph, ...) are skipped on load with one warning
naming them.

Example::

    from fleetlite.distributed import fleet
    s = fleet.DistributedStrategy()
    s.recompute = True
    s.recompute_configs = {"checkpoints": ["x"]}
    s.save_to_prototxt("dist_strategy.prototxt")   # recompute: true / recompute_configs { checkpoints: "x" }
    t = fleet.DistributedStrategy()
    t.load_from_prototxt("dist_strategy.prototxt")
    assert t == s
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Any

from .strategy_fields import CONFIGS, EXTRAS, FLAGS, MESSAGE_LISTS

DistributedStrategy = Any  # the strategy module imports this one (no import circle: annotated, not imported)

__all__ = ["dumps", "loads"]

_EXTRA_PREFIX = "# fleetlite: "
_PROTO_INT32 = ("fuse_grad_size_in_MB",)  # fleetlite also takes fractions of a MB there
# The order of Paddle's proto (field numbers), which is the order Paddle writes; the rest follow in table order.
_PROTO_ORDER = ("amp", "recompute", "localsgd", "dgc", "gradient_merge", "lars", "lamb", "pipeline", "sync_batch_norm",
                "fuse_all_reduce_ops", "fuse_grad_size_in_MB", "adaptive_localsgd", "fp16_allreduce", "sharding",
                "last_comm_group_size_MB", "find_unused_parameters", "tensor_parallel", "without_graph_optimization",
                "recompute_configs", "amp_configs", "localsgd_configs", "gradient_merge_configs", "dgc_configs",
                "pipeline_configs", "lars_configs", "lamb_configs", "adaptive_localsgd_configs", "sharding_configs",
                "hybrid_configs", "tensor_parallel_configs")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{text}"'


def _lines(name: str, value: Any) -> list[str]:
    if isinstance(value, list):
        out = []
        for v in value:
            if isinstance(v, dict):  # one message of a repeated message field: ``name { key: value ... }``
                out += [f"{name} {{", *("  " + line for k, x in v.items() for line in _lines(k, x)), "}"]
            else:
                out.append(f"{name}: {_scalar(v)}")
        return out
    return [f"{name}: {_scalar(value)}"]


def _section(path: str, changed: dict[str, Any], extras: list[str], indent: str) -> list[str]:
    out: list[str] = []
    for key, value in changed.items():
        key_path = f"{path}.{key}"
        if key_path in EXTRAS or path in EXTRAS:
            extras.extend(_lines(key_path, value))
        elif isinstance(value, dict):
            body = _section(key_path, value, extras, indent + "  ")
            if body:
                out += [f"{indent}{key} {{", *body, f"{indent}}}"]
        else:
            out += [indent + line for line in _lines(key, value)]
    return out


def dumps(strategy: DistributedStrategy) -> str:
    """The strategy's non-default fields in Paddle's text format (an empty string for a default strategy)."""
    changed = strategy.diff()
    lines: list[str] = []
    extras: list[str] = []
    for name in dict.fromkeys([*_PROTO_ORDER, *FLAGS, *CONFIGS]):
        if name in _PROTO_INT32 and name in changed and changed[name] != int(changed[name]):
            extras += _lines(name, changed[name])  # a fraction Paddle's int32 field cannot hold
        elif name in changed and name in FLAGS:
            lines += _lines(name, changed[name])
        elif name in changed:
            body = _section(name, changed[name], extras, "  ")
            if body:
                lines += [f"{name} {{", *body, "}"]
    lines += [_EXTRA_PREFIX + line for line in extras]
    return "".join(line + "\n" for line in lines)


# --- reading -------------------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"""\s*(?:(\#[^\n]*)  # a comment
                        |("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')  # a quoted string
                        |([{}\[\]:<>,;])  # punctuation
                        |([^\s{}\[\]:<>,;"'\#]+))  # a name, number or enum value""", re.VERBOSE)
_CLOSE = {"{": "}", "<": ">"}


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip():
                raise ValueError(f"not protobuf text format at character {pos}: {text[pos:pos + 40]!r}")
            break
        pos = m.end()
        if m.group(1) is None and m.group(0).strip():
            out.append(m.group(0).strip())
    return out


def _value(token: str) -> Any:
    if token[0] in "\"'":
        try:
            return ast.literal_eval("b" + token).decode("utf-8")  # protobuf escapes UTF-8 bytes as octal
        except (SyntaxError, ValueError, UnicodeDecodeError):
            return ast.literal_eval(token)
    if token in ("true", "True", "t"):
        return True
    if token in ("false", "False", "f"):
        return False
    for kind in (int, float):
        try:
            return kind(token)
        except ValueError:
            pass
    return token  # an enum value, e.g. mode: COLLECTIVE


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens, self.i = tokens, 0

    def message(self, end: str | None) -> list[tuple[str, Any]]:
        fields: list[tuple[str, Any]] = []
        while self.i < len(self.tokens) and self.tokens[self.i] != end:
            name = self.tokens[self.i]
            self.i += 1
            if self.tokens[self.i] == ":":
                self.i += 1
            tok = self.tokens[self.i]
            self.i += 1
            if tok in _CLOSE:
                fields.append((name, self.message(_CLOSE[tok])))
                self.i += 1
            elif tok == "[":
                while self.tokens[self.i] != "]":
                    if self.tokens[self.i] != ",":
                        fields.append((name, _value(self.tokens[self.i])))
                    self.i += 1
                self.i += 1
            else:
                fields.append((name, _value(tok)))
            if self.i < len(self.tokens) and self.tokens[self.i] in ",;":
                self.i += 1
        return fields


def _updates(fields: list[tuple[str, Any]], spec: dict[str, Any], current: dict[str, Any], where: str,
             skipped: list[str]) -> dict[str, Any]:
    """Field list -> updates for one section; repeated fields are appended to the current list (Paddle's Merge)."""
    out: dict[str, Any] = {}
    for key, value in fields:
        entry = spec.get(key)
        if entry is None:
            skipped.append(f"{where}.{key}")
        elif isinstance(entry, dict):
            out[key] = _updates(value, entry, current[key], f"{where}.{key}", skipped)
        elif isinstance(entry[0], list):  # appended as Paddle's Merge does; a list with a default is replaced
            message = MESSAGE_LISTS.get(f"{where}.{key}")
            if message is not None and isinstance(value, list):  # a message: its fields as a dict
                item: dict[str, Any] = {}
                for k, x in value:
                    if isinstance(message.get(k), list):
                        item.setdefault(k, []).append(x)
                    else:
                        item[k] = x
                value = item
            out.setdefault(key, [] if entry[0] else list(current[key])).append(value)
        else:
            out[key] = value
    return out


def loads(text: str, strategy: DistributedStrategy) -> None:
    """Merge the fields of ``text`` (protobuf text format) into ``strategy``, validating each value."""
    skipped: list[str] = []
    for name, value in _Parser(_tokens(text)).message(None):
        if name in FLAGS:
            setattr(strategy, name, value)
        elif name in CONFIGS and isinstance(value, list):
            setattr(strategy, name, _updates(value, CONFIGS[name], strategy.to_dict()[name], name, skipped))
        else:
            skipped.append(name)
    extras: dict[str, list[Any]] = {}
    for line in text.splitlines():
        if line.strip().startswith(_EXTRA_PREFIX):
            path, _, token = line.strip()[len(_EXTRA_PREFIX):].partition(": ")
            extras.setdefault(path, []).append(_value(token.strip()))
    for path, values in extras.items():
        if path in _PROTO_INT32:
            setattr(strategy, path, values[-1])
            continue
        if path not in EXTRAS and path.split(".")[0] not in EXTRAS:
            skipped.append(path)
            continue
        *sections, key = path.split(".")
        spec = CONFIGS[sections[0]]
        for s in sections[1:]:
            spec = spec[s]
        update: Any = {key: values if isinstance(spec[key][0], list) else values[-1]}
        for s in reversed(sections[1:]):
            update = {s: update}
        setattr(strategy, sections[0], update)
    if skipped:
        warnings.warn("fleetlite: load_from_prototxt skipped fields fleetlite does not use (parameter-server, "
                      f"static-graph or newer Paddle fields; see strategy_fields): {', '.join(dict.fromkeys(skipped))}",
                      stacklevel=3)
