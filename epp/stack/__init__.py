"""`epp stack`: the local stack (a modelsim fleet, Pointsman and Envoy as child processes, no Docker). Flags and
settings: settings.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.stack.localstack import stack_command

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): `epp
# stack`'s flags load no stack.
_LAZY = {
    "stack_command": "localstack",
}

__all__ = ["stack_command"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    module, _, attr = _LAZY[name].partition(":")
    value = getattr(import_module(f"{__name__}.{module}"), attr or name)
    globals()[name] = value
    return value
