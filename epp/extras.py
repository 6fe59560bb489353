"""Optional features and the pip extras that install them.

The base install serves ext_proc with endpoints from a file or Kubernetes. Everything else is an extra
(pyproject.toml), imported only where it is used; a feature whose extra is missing fails with an error that names
the extra instead of an ImportError from deep inside:

    error: --redis-url needs the 'redis' extra: pip install 'pointsman[redis]'

`check(extra, feature)` is the cheap test the settings run on the flags (it imports nothing), `require(extra,
module, feature)` imports a module of the extra where the feature starts.

In the same spirit every package's face loads what it exports on first use: `lazy_exports(__name__, table)` is the
face's `__getattr__` (PEP 562), so `epp endpoints` never imports the server behind a name it does not touch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

# extra -> the importable modules it provides (pyproject.toml lists the distributions)
EXTRAS: dict[str, tuple[str, ...]] = {
    "redis": ("redis",),
    "precise": ("zmq", "msgpack", "nats", "tokenizers", "jinja2"),
    "replicas": ("zmq", "msgpack"),
    "envoy-config": ("envoy_data_plane", "pydantic"),
    "stack": ("zmq", "msgpack", "envoy_data_plane"),  # and the Envoy binary (epp.stack.settings)
}


class MissingExtra(ImportError):
    """A feature was asked for whose pip extra is not installed."""

    def __init__(self, extra: str, feature: str, module: str) -> None:
        super().__init__(f"{feature} needs the '{extra}' extra: pip install 'pointsman[{extra}]'", name=module)
        self.extra = extra
        self.feature = feature


def available(module: str) -> bool:
    """Whether `module` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check(extra: str, feature: str, modules: tuple[str, ...] | None = None) -> None:
    """MissingExtra unless the extra's modules (or the given ones of it) are installed. Imports nothing."""
    for module in modules if modules is not None else EXTRAS[extra]:
        if not available(module):
            raise MissingExtra(extra, feature, module)


def require(extra: str, module: str, feature: str) -> ModuleType:
    """Import `module` of `extra` for `feature`; MissingExtra when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] != module.split(".")[0]:
            raise  # the module is there but something it needs is broken: not a missing extra
        raise MissingExtra(extra, feature, module) from e


__all__ = ["EXTRAS", "MissingExtra", "available", "check", "require"]


def lazy_exports(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A package face's module `__getattr__` (PEP 562). `table` maps each exported name to the submodule that
    defines it ("module", or "module:name" when the submodule calls it otherwise); the submodule is imported on
    the first use of the name, and the value is kept in the package's namespace so later uses cost nothing."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:  # noqa: N807 (the module hook's own name)
        entry = table.get(name)
        if entry is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = entry.partition(":")
        value = getattr(importlib.import_module(f"{package}.{module}"), attr or name)
        namespace[name] = value
        return value

    return __getattr__
