"""The live routing dashboard: a page on the metrics port showing the fleet, the decisions, explain, charts and
the effective config (docs/dashboard.md). `Dashboard` wires it; its `DecisionRecorder` observes the request path (RecorderObserver)."""

from epp.api.dashboard.recorder import DecisionRecorder
from epp.api.dashboard.web import Dashboard

__all__ = ["Dashboard", "DecisionRecorder"]
