"""Precise prefix routing's KV events: the engines' ZMQ publishers (sources.py, subscriber.py, replay.py), decoded
(decode.py) and applied to the precise index (apply.py), wired as one service (service.py). Flags and settings:
settings.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.fleet.kvevents.service import PreciseService
    from epp.fleet.kvevents.sources import KVEventsConfigError, parse_kv_events_field

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562):
# epp.fleet.kvevents.settings loads no subscriber.
_LAZY = {
    "PreciseService": "service",
    "KVEventsConfigError": "sources", "parse_kv_events_field": "sources",
}

__all__ = ["KVEventsConfigError", "PreciseService", "parse_kv_events_field"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    module, _, attr = _LAZY[name].partition(":")
    value = getattr(import_module(f"{__name__}.{module}"), attr or name)
    globals()[name] = value
    return value
