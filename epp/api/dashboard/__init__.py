"""The live routing dashboard: a page on the metrics port showing the fleet, the decisions, explain, charts and
the effective config (docs/dashboard.md). `Dashboard` wires it; its `DecisionRecorder` observes the request path (RecorderObserver)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.api.dashboard.recorder import DecisionRecord, DecisionRecorder, RecorderObserver
    from epp.api.dashboard.web import Dashboard

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562).
_LAZY = {
    "DecisionRecord": "recorder", "DecisionRecorder": "recorder", "RecorderObserver": "recorder",
    "Dashboard": "web",
}

__all__ = ["Dashboard", "DecisionRecord", "DecisionRecorder", "RecorderObserver"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    module, _, attr = _LAZY[name].partition(":")
    value = getattr(import_module(f"{__name__}.{module}"), attr or name)
    globals()[name] = value
    return value
