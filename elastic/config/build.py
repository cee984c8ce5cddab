"""Build typed config sections from nested mappings: ``_build`` checks every key and coerces
every value against the dataclass annotations of elastic/config/schema.py (one-line
ConfigError naming the key). Shared by load.py and init_from.py, which import nothing else of
each other's.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Dict, Mapping

import yaml

from elastic.config.errors import ConfigError


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


class _Override:
    """A `--set` value: its YAML reading, and its text for string fields (YAML 1.1 would turn
    `5:6` into 306 and `no` into False; a string field wants what the user typed)."""

    def __init__(self, text: str):
        self.text = text
        self.value = _parse_scalar(text)


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check (and gently coerce) `value` against the annotated type `tp`."""
    if isinstance(value, _Override):
        wants_str = tp is str or (typing.get_origin(tp) is typing.Union and str in typing.get_args(tp))
        # A string field takes YAML's reading when it is a string ('' or "a b"), else the text.
        value = value.text if wants_str and not isinstance(value.value, str) else value.value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:  # Optional[X]
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner[0])
    if origin in (dict, Dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        kt, vt = args or (str, Any)
        return {_coerce(f"{key}.{k}", k, kt): _coerce(f"{key}.{k}", v, vt) for k, v in value.items()}
    if origin in (list, typing.List):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (et,) = args or (Any,)
        return [_coerce(f"{key}[{i}]", v, et) for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):  # YAML's true/false for a field spelled auto|true|false
            return "true" if value else "false"
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{key}: unknown key (known: {known})")
        tp = hints[k]
        if isinstance(v, _Override) and dataclasses.is_dataclass(tp):
            v = v.value
        if dataclasses.is_dataclass(tp):
            if not isinstance(v, Mapping):
                raise ConfigError(f"{key}: expected a section (mapping), got {v!r}")
            kwargs[k] = _build(tp, v, f"{key}.")
        else:
            kwargs[k] = _coerce(key, v, tp)
    return cls(**kwargs)


def _parse_scalar(text: str) -> Any:
    """`--set` values are YAML scalars: 3, 0.1, true, null, [1, 2], {a: 1}, or a string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
