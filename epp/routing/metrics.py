"""Routing metrics, registered on the EPP's own registry:

- pointsman_route_decisions_total{route, rule, target}     counter: requests each rule sent to each target
- pointsman_route_document_errors_total{kind}              counter: rejected route documents
- pointsman_route_documents{kind}                          gauge: documents serving now (computed at scrape)

Labels hold names from the configuration only (never header values, never credentials).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from epp.routing.decision import RouteDecision
    from epp.routing.service import RoutingService


class _Documents(Collector):
    def __init__(self, service: RoutingService) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("pointsman_route_documents", "Route documents serving now, by kind.", labels=["kind"])
        for kind, n in sorted(self.service.documents.counts().items()):
            g.add_metric([kind], float(n))
        yield g


class RoutingMetrics:
    def __init__(self, registry: CollectorRegistry, service: RoutingService) -> None:
        self.decisions = Counter("pointsman_route_decisions_total", "Requests routed, by route, rule and target.",
                                 ["route", "rule", "target"], registry=registry)
        self.errors = Counter("pointsman_route_document_errors_total", "Route documents rejected, by kind.",
                              ["kind"], registry=registry)
        registry.register(_Documents(service))
        self._children: dict[tuple[str, str, str], Any] = {}

    def decision(self, d: RouteDecision) -> None:
        key = (f"{d.route.kind}/{d.route.key}", d.rule.name, d.target.backend)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.decisions.labels(*key)
        child.inc()

    def document_error(self, kind: str) -> None:
        self.errors.labels(kind).inc()
