"""Typed plugin parameters, validated at load.

A plugin declares `Params`, a dataclass whose field names are the config keys (camelCase, as in the YAML).
Supported field types: bool, int, float, str, Literal[...], `X | None`, list[str], dict[str, str] and Any
(validated by the plugin's own `validate`). Field metadata may carry `min`/`max` bounds.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from scheduling.framework.errors import ConfigError, join_path

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = hints
    return hints


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp))
    if origin is list:
        return f"a list of {_describe(get_args(tp)[0])}"
    if origin is dict:
        return "a mapping of strings"
    if tp is type(None):
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _convert(tp: Any, value: Any, source: str, path: str) -> Any:
    origin = get_origin(tp)
    bad = ConfigError(source, path, f"expected {_describe(tp)}, got {value!r}")
    if tp is Any:
        return value
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise bad
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in get_args(tp):
            return None
        for arg in get_args(tp):
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, source, path)
            except ConfigError:
                continue
        raise bad
    if origin is list:
        if not isinstance(value, list):
            raise bad
        (item,) = get_args(tp)
        return [_convert(item, v, source, join_path(path, i)) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise bad
        _, vt = get_args(tp)
        return {str(k): _convert(vt, v, source, join_path(path, str(k))) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise bad
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise bad
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad
    raise ConfigError(source, path, f"unsupported parameter type {tp!r}")


def parse_params(cls: type | None, raw: Any, *, source: str, path: str) -> Any:
    """Build `cls` (a Params dataclass) from a raw mapping; unknown keys and wrong types raise ConfigError."""
    if cls is None:
        if isinstance(raw, Mapping) and raw:
            first = str(next(iter(raw)))
            raise ConfigError(
                source, join_path(path, first), "unknown parameter; this plugin takes no parameters"
            )
        if raw:
            raise ConfigError(source, path, f"this plugin takes no parameters, got {raw!r}")
        return None
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(source, path, f"expected a mapping of parameters, got {raw!r}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in raw if k not in fields]
    if unknown:
        raise ConfigError(
            source,
            join_path(path, str(unknown[0])),
            f"unknown parameter; expected one of {', '.join(sorted(fields)) or '(none)'}",
        )
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        fpath = join_path(path, name)
        value = _convert(hints[name], raw[name], source, fpath)
        lo = f.metadata.get("min")
        hi = f.metadata.get("max")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if lo is not None and value < lo:
                raise ConfigError(source, fpath, f"expected a value >= {lo}, got {value!r}")
            if hi is not None and value > hi:
                raise ConfigError(source, fpath, f"expected a value <= {hi}, got {value!r}")
        values[name] = value
    return cls(**values)


def bounded(default: Any, *, min: float | None = None, max: float | None = None) -> Any:  # noqa: A002
    """A dataclass field with bounds checked by `parse_params`."""
    meta = {}
    if min is not None:
        meta["min"] = min
    if max is not None:
        meta["max"] = max
    return dataclasses.field(default=default, metadata=meta)


def parse_duration(value: object) -> float:
    """Seconds from a number or a Go-style duration string ("200ms", "2s", "1.5s", "100us", "5m", "1h")."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        s = value.strip()
        for suffix, scale in (("ms", 1e-3), ("us", 1e-6), ("µs", 1e-6), ("ns", 1e-9), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
            if s.endswith(suffix):
                try:
                    return float(s[: -len(suffix)]) * scale
                except ValueError:
                    break
        try:
            return float(s)
        except ValueError:
            pass
    raise ValueError(f"expected a duration like '200ms' or a number of seconds, got {value!r}")
