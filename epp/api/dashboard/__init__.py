"""The live routing dashboard: a page on the metrics port showing the fleet, the decisions, explain, charts and
the effective config (docs/dashboard.md). `Dashboard` wires it; its `DecisionRecorder` observes the request path (RecorderObserver)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.api.dashboard.recorder import DecisionRecord, DecisionRecorder, RecorderObserver
    from epp.api.dashboard.web import Dashboard

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562).
_LAZY = {
    "DecisionRecord": "recorder", "DecisionRecorder": "recorder", "RecorderObserver": "recorder",
    "Dashboard": "web",
}

__all__ = ["Dashboard", "DecisionRecord", "DecisionRecorder", "RecorderObserver"]


__getattr__ = lazy_exports(__name__, _LAZY)
