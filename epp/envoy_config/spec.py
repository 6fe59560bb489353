"""What a generated Envoy bootstrap is made of: one plain dataclass, no Envoy types (cheap to import)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp.envoy_config.providers import RouteFragments

VARIANTS = ("original-dst", "override-host")
RESPONSE_PHASES = ("full", "headers", "lean")
FAILURE_MODES = ("closed", "open")


@dataclass
class EnvoyConfigSpec:
    variant: str = "original-dst"
    listen_port: int = 8081
    listen_address: str = "127.0.0.1"
    admin_port: int = 9901
    epp_host: str = "127.0.0.1"
    epp_port: int = 9002
    # Replicas: more Pointsman addresses behind the `epp` cluster, besides epp_host:epp_port (round robin per
    # ext_proc stream), and how many workers each runs behind its one port (`epp serve --workers N`): the kernel
    # spreads connections, not streams, over the workers, so Envoy needs several connections per replica
    # (epp/envoy_config/replicas.py). 0 below: Envoy's default (unlimited streams per connection, no recycling).
    epp_replicas: list[tuple[str, int]] = field(default_factory=list)
    epp_workers: int = 1
    epp_max_streams_per_connection: int = 0
    epp_max_requests_per_connection: int = 0
    # override-host with a static list: the pool's endpoints, written into the file once.
    endpoints: list[tuple[str, int]] = field(default_factory=list)
    # override-host with EDS: the pool cluster's endpoints come from Pointsman's EDS server (on the ext_proc
    # port, through the `epp` cluster), as the ClusterLoadAssignment named `pool_name`.
    eds: bool = False
    pool_name: str = "default"
    # Reconnect backoff of the EDS stream after Pointsman restarts (Envoy's own default is 0.5 s up to 30 s).
    eds_retry_base_s: float = 0.25
    eds_retry_max_s: float = 2.0
    # "" picks by failure mode: FULL_DUPLEX_STREAMED when closed; when open, BUFFERED requests and STREAMED responses,
    # the modes in which Envoy keeps the body itself, so a broken ext_proc stream loses nothing (in
    # FULL_DUPLEX_STREAMED the body chunks sent to Pointsman are gone with it: Envoy answers 500 despite
    # failure_mode_allow until health checks take Pointsman out; measured in tests/envoy_config/test_failopen.py).
    request_body_mode: str = ""
    response_body_mode: str = ""
    # "full": response headers, body and trailers go to Pointsman (usage tokens, served endpoint, SSE echo).
    # "headers": response headers (and trailers) but no body: the status and the served endpoint, one message more
    # than lean, so passive health sees 5xx and connection failures.
    # "lean": only the request phases; response trailers stay SEND so Envoy keeps the stream open until the
    # response ends, which keeps the in-flight counts exact with half the messages.
    response_phases: str = "full"
    # "closed" (default): no pick, no upstream: when Pointsman cannot be reached the request fails (500/504).
    # "open": ext_proc failure_mode_allow, a health-checked `epp` cluster with a short connect timeout, and the
    # override_host fallback policy (least request over the pool's healthy endpoints) serves what Pointsman did not
    # route. Needs an endpoint list: --eds (kept current by Pointsman, kept by Envoy while Pointsman is away) or a
    # static one.
    failure_mode: str = "closed"
    epp_connect_timeout_s: float = 0.25  # open mode; closed keeps 2 s
    epp_health_interval_s: float = 1.0  # open mode: gRPC health checks of Pointsman on its ext_proc port
    message_timeout_s: float = 0  # 0: 300 s closed, 30 s open (a hung Pointsman delays requests this long)
    upstream_timeout_s: int = 600
    buffer_limit_bytes: int = 64 * 1024 * 1024
    epp_tls: bool = False
    node_id: str = "pointsman-envoy"
    node_cluster: str = "pointsman"
    # Observability (epp/envoy_config/observe.py): Envoy's own OpenTelemetry tracing to this OTLP/gRPC collector
    # (host, port), its service name and random sampling percent; a file access log printing the decision id.
    tracing_collector: tuple[str, int] | None = None
    tracing_service_name: str = "envoy"
    tracing_sampling: float = 100.0
    access_log: str = ""
    # The routing layer's additions (external provider clusters and routes, pool-route retries): an
    # epp.envoy_config.providers.RouteFragments, applied to the rendered bootstrap.
    route_fragments: RouteFragments | None = None

    def body_modes(self) -> tuple[str, str]:
        """The request and response body modes, defaults resolved for the failure mode."""
        open_mode = self.failure_mode == "open"
        return (self.request_body_mode or ("BUFFERED" if open_mode else "FULL_DUPLEX_STREAMED"),
                self.response_body_mode or ("STREAMED" if open_mode else "FULL_DUPLEX_STREAMED"))

    def message_timeout(self) -> float:
        return self.message_timeout_s or (30.0 if self.failure_mode == "open" else 300.0)

    def check(self) -> None:
        """Raise ValueError with a clear message for a combination Envoy could not run."""
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown Envoy config variant {self.variant!r}; expected one of {VARIANTS}")
        if self.response_phases not in RESPONSE_PHASES:
            raise ValueError(f"response_phases must be one of {RESPONSE_PHASES}, got {self.response_phases!r}")
        if self.epp_workers < 1 or self.epp_max_streams_per_connection < 0 or self.epp_max_requests_per_connection < 0:
            raise ValueError("--epp-workers must be at least 1, and the per-connection limits 0 or more")
        if self.eds and self.variant != "override-host":
            raise ValueError("--eds feeds the override-host pool cluster; the original-dst variant has no "
                             "endpoint list (use --variant override-host)")
        if self.eds and self.endpoints:
            raise ValueError("--eds takes the endpoints from Pointsman; do not also list them (--endpoint)")
        if self.eds and not self.pool_name:
            raise ValueError("--eds needs the pool's name (the EDS resource Envoy subscribes to)")
        if self.failure_mode not in FAILURE_MODES:
            raise ValueError(f"failure mode must be one of {FAILURE_MODES}, got {self.failure_mode!r}")
        if self.failure_mode == "open" and self.variant == "original-dst":
            raise ValueError("--failure-mode open needs the pool's endpoints to fall back on; the original-dst "
                             "cluster has none (no pick, no host): use --eds (the pool kept current by Pointsman) "
                             "or --variant override-host with --endpoint / --endpoints-file")
        if not 0.0 <= self.tracing_sampling <= 100.0:
            raise ValueError(f"the tracing sampling is a percentage, got {self.tracing_sampling}")
        if self.message_timeout_s < 0:
            raise ValueError(f"the ext_proc message timeout must be positive, got {self.message_timeout_s}")
        if self.variant == "override-host" and not self.eds and not self.endpoints:
            raise ValueError("the override-host variant needs the pool's endpoints (the policy picks among them): "
                             "give --endpoint / --endpoints-file, or --eds to have Pointsman serve them")


def parse_collector(value: str) -> tuple[str, int]:
    """HOST:PORT (an http:// or https:// prefix is accepted and dropped: Envoy speaks plain gRPC here)."""
    text = value.strip()
    for scheme in ("http://", "https://"):
        if text.startswith(scheme):
            text = text[len(scheme):]
    host, sep, port = text.rstrip("/").rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--tracing-collector {value!r}: expected HOST:PORT (the OTLP/gRPC port, usually 4317)")
    return host.strip("[]"), int(port)


def add_observe_flags(ec: argparse.ArgumentParser) -> None:
    """`epp envoy-config` flags of epp/envoy_config/observe.py (here: cheap to import)."""
    add = ec.add_argument
    add("--tracing-collector", default=None, metavar="HOST:PORT",
        help="Envoy traces too (OpenTelemetry tracer, OTLP/gRPC to this collector; Pointsman's spans hang under "
             "its own); default: no tracing")
    add("--tracing-service-name", default="envoy", help="service.name of Envoy's spans (envoy)")
    add("--tracing-sampling", type=float, default=100.0,
        help="percent of requests without a sampled traceparent that Envoy traces (100)")
    add("--access-log", default="", metavar="PATH",
        help="write an access log with the decision id (%%DYNAMIC_METADATA(pointsman:decision_id)%%), e.g. "
             "/dev/stdout (default: none)")
