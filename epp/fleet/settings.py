"""`epp serve`'s fleet flags, parsed once: where the endpoints come from, how they are scraped, and passive health.

Cheap to import (the CLI builds every command's flags): the parsers these settings use are imported in
`from_args`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from epp.argtypes import parse_bool, parse_duration_arg

BACKOFF_MAX_S = 1.0  # --scrape-backoff-max's default: the cap of an out endpoint's doubling scrape backoff


def add_source_flags(g: argparse._ActionsContainer) -> None:
    """The "pool and endpoints" group."""
    g.add_argument("--pool-name", default=os.environ.get("POOL_NAME"), help="InferencePool to serve")
    g.add_argument("--pool-namespace", default=os.environ.get("NAMESPACE", "default"))
    g.add_argument("--pool-group", default="inference.networking.k8s.io", help="InferencePool API group")
    g.add_argument("--endpoints-file", default=None, help="standalone mode: a YAML file of pools and endpoints")
    g.add_argument("--endpoint-selector", default=None, help="standalone selector mode: k=v,... over pods")
    g.add_argument("--endpoint-target-ports", default=None, help="selector mode: comma list of ports")
    g.add_argument("--kubeconfig", default=None, help="kubeconfig path (default: in-cluster, then ~/.kube)")
    g.add_argument("--epp-service-name", default=os.environ.get("EPP_SERVICE_NAME") or None,
                   help="serve every InferencePool of the namespace whose endpointPickerRef names this Service "
                        "(default: $EPP_SERVICE_NAME); --pool-name stays the default pool")


def add_scrape_flags(g: argparse._ActionsContainer) -> None:
    g.add_argument("--refresh-metrics-interval", type=parse_duration_arg, default=0.05, help="scrape interval (50ms)")
    g.add_argument("--metrics-staleness-threshold", type=parse_duration_arg, default=2.0, help="stale after (2s)")


def add_health_flags(g: argparse._ActionsContainer) -> None:
    """The "health (scraping and passive)" group."""
    g.add_argument("--scrape-timeout", type=parse_duration_arg, default=None,
                   help="timeout of one metrics scrape (default: 3 hung scrapes in a row fit in the staleness "
                        "threshold: 0.45s with 2s)")
    g.add_argument("--scrape-backoff-max", type=parse_duration_arg, default=BACKOFF_MAX_S,
                   help="an endpoint that is out is scraped with a doubling backoff, capped at this (1s)")
    g.add_argument("--passive-health", type=parse_bool, default=True,
                   help="count failed responses (5xx, resets, silent streams) against endpoints (default true)")
    g.add_argument("--passive-failure-threshold", type=int, default=5,
                   help="failed responses in a row that take an endpoint out (5)")
    g.add_argument("--passive-cooldown", type=parse_duration_arg, default=10.0,
                   help="how long an endpoint stays out before one probe request is let through (10s)")
    g.add_argument("--passive-max-cooldown", type=parse_duration_arg, default=300.0,
                   help="each failed probe doubles the cool-down, up to this (5m)")
    g.add_argument("--passive-silence-timeout", type=parse_duration_arg, default=60.0,
                   help="a streaming response silent this long counts as failed (60s)")


@dataclass(frozen=True)
class SourceSettings:
    """Endpoint sources, in order of precedence: the endpoints file, pods by label, every InferencePool naming
    this EPP's Service, the one InferencePool."""

    pool_name: str | None = None  # the default pool (and the InferencePool to watch)
    pool_namespace: str = "default"
    pool_group: str = "inference.networking.k8s.io"
    endpoints_file: str | None = None
    selector: dict[str, str] = field(default_factory=dict)  # --endpoint-selector, parsed
    target_ports: tuple[int, ...] = ()  # --endpoint-target-ports, parsed
    kubeconfig: str | None = None
    epp_service_name: str | None = None

    @property
    def kind(self) -> str | None:
        """Which source serves the pools: "file", "service" (several InferencePools), "selector", "pool", or
        None (only route documents name pools)."""
        if self.endpoints_file:
            return "file"
        if self.epp_service_name:
            return "service"
        if self.selector:
            return "selector"
        return "pool" if self.pool_name else None

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> SourceSettings:
        from epp.fleet.k8s import parse_ports, parse_selector, pool_resource

        selector: dict[str, str] = {}
        ports: tuple[int, ...] = ()
        watches = not ns.endpoints_file and not ns.epp_service_name
        if watches and ns.endpoint_selector:
            if not ns.endpoint_target_ports:
                raise ValueError("--endpoint-selector needs --endpoint-target-ports")
            selector, ports = parse_selector(ns.endpoint_selector), parse_ports(ns.endpoint_target_ports)
        s = cls(pool_name=ns.pool_name, pool_namespace=ns.pool_namespace, pool_group=ns.pool_group,
                endpoints_file=ns.endpoints_file, selector=selector, target_ports=ports, kubeconfig=ns.kubeconfig,
                epp_service_name=ns.epp_service_name)
        if s.kind in ("service", "pool"):
            pool_resource(s.pool_group)  # a clear error for an unknown group, before anything connects
        return s


def bounded_timeout(staleness: float, failure_threshold: int = 3, interval: float = 0.05) -> float:
    """A scrape timeout that takes a hung metrics endpoint out of rotation within the staleness threshold:
    `failure_threshold` timeouts in a row, each followed by up to one round before the next scrape starts, fit
    in 75% of `staleness` (room for a busy loop). Between 50 ms and 1 s."""
    budget = 0.75 * staleness / max(1, failure_threshold) - interval
    return min(1.0, max(0.05, budget))


@dataclass(frozen=True)
class ScrapeSettings:
    interval: float = 0.05  # --refresh-metrics-interval
    staleness: float = 2.0  # --metrics-staleness-threshold
    timeout: float = 0.45  # --scrape-timeout, else bounded_timeout(staleness, 3, interval)
    backoff_max: float = BACKOFF_MAX_S  # --scrape-backoff-max: the cap of an out endpoint's doubling backoff

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ScrapeSettings:
        interval, staleness = ns.refresh_metrics_interval, ns.metrics_staleness_threshold
        backoff_max = ns.scrape_backoff_max
        if backoff_max < 0:
            raise ValueError(f"--scrape-backoff-max: expected a duration >= 0, got {backoff_max}")
        return cls(interval, staleness, ns.scrape_timeout or bounded_timeout(staleness, 3, interval), backoff_max)


@dataclass(frozen=True)
class PassiveSettings:
    """Response-path failures take endpoints out of rotation (epp/fleet/passive.py); off with --passive-health=false."""

    enabled: bool = True
    failure_threshold: int = 5
    cooldown: float = 10.0
    max_cooldown: float = 300.0  # never below `cooldown`
    silence_timeout: float = 60.0

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> PassiveSettings:
        return cls(enabled=ns.passive_health, failure_threshold=ns.passive_failure_threshold,
                   cooldown=ns.passive_cooldown, max_cooldown=max(ns.passive_max_cooldown, ns.passive_cooldown),
                   silence_timeout=ns.passive_silence_timeout)


__all__ = ["BACKOFF_MAX_S", "PassiveSettings", "ScrapeSettings", "SourceSettings", "add_health_flags", "add_scrape_flags",
           "add_source_flags", "bounded_timeout"]
