"""Strict-reading helpers and profile assembly shared by the config formats."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduling.framework import (
    BuildContext,
    ConfigError,
    Filter,
    FilterScorer,
    Picker,
    Plugin,
    Profile,
    ProfileHandler,
    Scorer,
    create,
    create_picker,
)
from scheduling.framework.errors import join_path


@dataclass
class Doc:
    """One YAML document and where it came from."""

    data: Mapping[str, Any]
    source: str


def expect_mapping(value: Any, source: str, path: str, what: str = "a mapping") -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(source, path, f"expected {what}, got {_show(value)}")
    return value


def expect_list(value: Any, source: str, path: str, what: str = "a list") -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(source, path, f"expected {what}, got {_show(value)}")
    return value


def expect_str(value: Any, source: str, path: str, what: str = "a non-empty string") -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(source, path, f"expected {what}, got {_show(value)}")
    return value


def expect_weight(value: Any, source: str, path: str) -> float:
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(source, path, f"expected a non-negative number, got {_show(value)}")
    return float(value)


def check_keys(m: Mapping[str, Any], allowed: Sequence[str], source: str, path: str) -> None:
    for key in m:
        if key not in allowed:
            raise ConfigError(
                source, join_path(path, str(key)), f"unknown field; expected one of {', '.join(allowed)}"
            )


def _show(value: Any) -> str:
    if value is None:
        return "nothing (null or missing)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def build_plugin(
    type_name: Any,
    name: Any,
    params: Any,
    *,
    source: str,
    path: str,
    dialect: str,
    shared: dict[Any, Any],
    params_key: str,
) -> Plugin[Any]:
    tname = expect_str(type_name, source, join_path(path, "type"), "a plugin type name")
    if name is not None:
        expect_str(name, source, join_path(path, "name"), "a non-empty plugin name")
    build = BuildContext(source=source, path=path, dialect=dialect, shared=shared)
    return create(tname, name or tname, params, build=build, params_key=params_key)


def build_plugins(
    entries: list[Any],
    *,
    source: str,
    base: str,
    dialect: str,
    shared: dict[Any, Any],
    params_key: str,
) -> list[tuple[Plugin[Any], str]]:
    """Build every `{type, name, <params_key>}` entry of a plugin list; names must be unique.
    Returns (plugin, path) in declaration order."""
    built: list[tuple[Plugin[Any], str]] = []
    names: set[str] = set()
    for i, raw in enumerate(entries):
        path = join_path(base, i)
        entry = expect_mapping(raw, source, path, f"a plugin entry {{type, name, {params_key}}}")
        check_keys(entry, ("type", "name", params_key), source, path)
        plugin = build_plugin(
            entry.get("type"),
            entry.get("name"),
            entry.get(params_key),
            source=source,
            path=path,
            dialect=dialect,
            shared=shared,
            params_key=params_key,
        )
        if plugin.name in names:
            raise ConfigError(
                source, join_path(path, "name"), f"duplicate plugin name {plugin.name!r}; names must be unique"
            )
        names.add(plugin.name)
        built.append((plugin, path))
    return built


def resolve_plugin_refs(
    entries: list[Any],
    plugins: Mapping[str, Plugin[Any]],
    *,
    source: str,
    base: str,
    name_key: str,
) -> list[tuple[Plugin[Any], float | None, str]]:
    """Each `{<name_key>, weight}` reference resolved to a declared plugin: (plugin, weight, path)."""
    refs: list[tuple[Plugin[Any], float | None, str]] = []
    for k, raw in enumerate(entries):
        rpath = join_path(base, k)
        ref = expect_mapping(raw, source, rpath, f"a plugin reference {{{name_key}, weight}}")
        check_keys(ref, (name_key, "weight"), source, rpath)
        rname = expect_str(ref.get(name_key), source, join_path(rpath, name_key), "a plugin name")
        if rname not in plugins:
            raise ConfigError(
                source,
                join_path(rpath, name_key),
                f"no plugin named {rname!r}; declared: {', '.join(plugins) or '(none)'}",
            )
        refs.append((plugins[rname], expect_weight(ref.get("weight"), source, join_path(rpath, "weight")), rpath))
    return refs


def assemble_profile(
    name: str,
    refs: Sequence[tuple[Plugin[Any], float | None, str]],
    *,
    source: str,
    path: str,
    shared: dict[Any, Any],
    dialect: str,
    prepend_filters: Sequence[Filter[Any]] = (),
) -> Profile:
    """Sort referenced plugins into filters, weighted scorers and one picker (max-score-picker if none)."""
    filters: list[Filter[Any]] = list(prepend_filters)
    scorers: list[tuple[Scorer[Any], float]] = []
    picker: Picker[Any] | None = None
    for plugin, weight, rpath in refs:
        if isinstance(plugin, ProfileHandler):
            raise ConfigError(
                source, rpath, f"{plugin.name!r} is a profile handler; it cannot be part of a profile"
            )
        if isinstance(plugin, Picker):
            if picker is not None:
                raise ConfigError(
                    source,
                    rpath,
                    f"profile {name!r} already has picker {picker.name!r}; a profile takes one picker",
                )
            picker = plugin
            continue
        if isinstance(plugin, FilterScorer) and plugin.filtering_enabled:
            filters.append(plugin)
        if isinstance(plugin, Scorer):
            scorers.append((plugin, 1.0 if weight is None else weight))
        elif isinstance(plugin, Filter):
            filters.append(plugin)
        else:
            raise ConfigError(
                source, rpath, f"plugin {plugin.name!r} of kind {plugin.kind!r} cannot be used in a profile"
            )
    if picker is None:
        picker = create_picker("max-score-picker", build=BuildContext(source, path, dialect, shared))
    return Profile(name, filters, scorers, picker)
