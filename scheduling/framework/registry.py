"""The plugin registry: type names, aliases and automatic discovery.

Plugins register themselves with `@register("type-name")` in their own module under
`scheduling/plugins/<kind>/`. `discover()` imports every module of those packages, so adding a plugin touches
only its file. Aliases (GIE, llm-d and Heimdall spellings) live here, never in the plugins.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from scheduling.framework.errors import ConfigError, join_path
from scheduling.framework.params import parse_params
from scheduling.framework.plugin import BuildContext, Filter, Picker, Plugin, ProfileHandler, Scorer

P = TypeVar("P", bound=type[Plugin[Any]])

_PLUGINS: dict[str, type[Plugin[Any]]] = {}
_DISCOVERED = False

PLUGIN_PACKAGES = (
    "scheduling.plugins.filters",
    "scheduling.plugins.scorers",
    "scheduling.plugins.pickers",
    "scheduling.plugins.handlers",
    "scheduling.plugins.producers",
    "scheduling.plugins.system",
)

# Aliases valid in every config dialect: alias -> canonical type name.
ALIASES: dict[str, str] = {
    # Heimdall spellings
    "waiting-requests-scorer": "queue-scorer",
    "running-requests-scorer": "running-requests-size-scorer",
    "kv-utilization-scorer": "kv-cache-utilization-scorer",
    "e2e": "single-profile-handler",
    "pd": "pd-profile-handler",
    # llm-d / GIE spellings
    "single": "single-profile-handler",
    "disagg": "pd-profile-handler",
    "by-label": "by-label-filter",
    "low-queue-filter": "saturation-filter",
    # Kthena spellings (the others are plugins of their own: least-request, least-latency, prefix-cache,
    # kvcache-aware, lora-affinity): gpu-usage is exactly 1 − KV-cache usage
    "gpu-usage": "kv-cache-utilization-scorer",
}

# Dialect-specific aliases win over ALIASES: Heimdall's kv-cache-utilization-scorer is block occupancy.
DIALECT_ALIASES: dict[str, dict[str, str]] = {
    "heimdall": {"kv-cache-utilization-scorer": "kv-block-occupancy-scorer"},
    "epp": {},
}


def register(type_name: str) -> Callable[[P], P]:
    """Class decorator: register a plugin class under its canonical type name."""

    def deco(cls: P) -> P:
        if type_name in _PLUGINS and _PLUGINS[type_name] is not cls:
            raise RuntimeError(
                f"plugin type {type_name!r} registered twice ({_PLUGINS[type_name]} and {cls})"
            )
        cls.type_name = type_name
        _PLUGINS[type_name] = cls
        return cls

    return deco


def discover() -> None:
    """Import every plugin module (once)."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    for pkg_name in PLUGIN_PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{pkg_name}.{info.name}")
    _DISCOVERED = True


def canonical(type_name: str, dialect: str = "epp") -> str:
    discover()
    name = DIALECT_ALIASES.get(dialect, {}).get(type_name, type_name)
    if name in _PLUGINS:
        return name
    return ALIASES.get(name, name)


def lookup(type_name: str, dialect: str = "epp") -> type[Plugin[Any]] | None:
    return _PLUGINS.get(canonical(type_name, dialect))


def plugin_types() -> dict[str, type[Plugin[Any]]]:
    """Canonical type name -> class, for every discovered plugin."""
    discover()
    return dict(_PLUGINS)


def aliases(dialect: str = "epp") -> dict[str, str]:
    discover()
    out = dict(ALIASES)
    out.update(DIALECT_ALIASES.get(dialect, {}))
    return out


def create(
    type_name: str,
    name: str = "",
    params: Any = None,
    *,
    build: BuildContext | None = None,
    params_key: str = "parameters",
) -> Plugin[Any]:
    """Build a plugin from its (possibly aliased) type name and raw parameters.

    `build.path` is the plugin entry's path (e.g. `plugins[2]`); parameter errors name
    `<path>.<params_key>.<field>`.
    """
    build = build or BuildContext()
    cls = lookup(type_name, build.dialect)
    if cls is None:
        known = ", ".join(sorted(plugin_types()))
        raise ConfigError(
            build.source,
            join_path(build.path, "type"),
            f"unknown plugin type {type_name!r}; known types: {known}",
        )
    ppath = join_path(build.path, params_key)
    typed = parse_params(cls.Params, params, source=build.source, path=ppath)
    given = frozenset(str(k) for k in params) if isinstance(params, Mapping) else frozenset()
    return cls(name or type_name, typed, dataclasses.replace(build, path=ppath, given=given))



def _kind_error(plugin: Plugin[Any], kind: str, build: BuildContext | None) -> ConfigError:
    build = build or BuildContext()
    where = join_path(build.path, "type")
    return ConfigError(build.source, where, f"{plugin.describe()} is a {plugin.kind}, not a {kind}")


def create_scorer(
    type_name: str, name: str = "", params: Any = None, *, build: BuildContext | None = None
) -> Scorer[Any]:
    """`create`, checked to give a scorer."""
    plugin = create(type_name, name, params, build=build)
    if isinstance(plugin, Scorer):
        return plugin
    raise _kind_error(plugin, "scorer", build)


def create_filter(
    type_name: str, name: str = "", params: Any = None, *, build: BuildContext | None = None
) -> Filter[Any]:
    """`create`, checked to give a filter."""
    plugin = create(type_name, name, params, build=build)
    if isinstance(plugin, Filter):
        return plugin
    raise _kind_error(plugin, "filter", build)


def create_picker(
    type_name: str, name: str = "", params: Any = None, *, build: BuildContext | None = None
) -> Picker[Any]:
    """`create`, checked to give a picker."""
    plugin = create(type_name, name, params, build=build)
    if isinstance(plugin, Picker):
        return plugin
    raise _kind_error(plugin, "picker", build)


def create_handler(
    type_name: str, name: str = "", params: Any = None, *, build: BuildContext | None = None
) -> ProfileHandler[Any]:
    """`create`, checked to give a profile handler."""
    plugin = create(type_name, name, params, build=build)
    if isinstance(plugin, ProfileHandler):
        return plugin
    raise _kind_error(plugin, "profile handler", build)
