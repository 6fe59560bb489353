"""The operator API: explain and endpoints over gRPC (explain.py, and the client commands in client.py), decision
receipts, Prometheus metrics, gRPC health, the metrics auth and the dashboard (dashboard/). Flags and settings:
settings.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.api.client import endpoints_command, explain_command
    from epp.api.explain import PointsmanService
    from epp.api.health import EppHealthServicer, add_health_servicer, start_health_server
    from epp.api.metrics import EppMetrics, RequestMetrics, start_metrics_server
    from epp.api.metrics_auth import KubeReviews, MetricsAuth
    from epp.api.model_metrics import ModelCollector
    from epp.api.slo_metrics import SloMetrics

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): the client
# commands load only their client, never the servers.
_LAZY = {
    "endpoints_command": "client", "explain_command": "client",
    "PointsmanService": "explain",
    "EppHealthServicer": "health", "add_health_servicer": "health", "start_health_server": "health",
    "EppMetrics": "metrics", "RequestMetrics": "metrics", "start_metrics_server": "metrics",
    "KubeReviews": "metrics_auth", "MetricsAuth": "metrics_auth",
    "ModelCollector": "model_metrics",
    "SloMetrics": "slo_metrics",
}

__all__ = ["EppHealthServicer", "EppMetrics", "KubeReviews", "MetricsAuth", "ModelCollector", "PointsmanService",
           "RequestMetrics", "SloMetrics", "add_health_servicer", "endpoints_command", "explain_command",
           "start_health_server", "start_metrics_server"]


__getattr__ = lazy_exports(__name__, _LAZY)
