"""What a generated Envoy bootstrap is made of: one plain dataclass, no Envoy types (cheap to import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VARIANTS = ("original-dst", "override-host")


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
    request_body_mode: str = "FULL_DUPLEX_STREAMED"
    response_body_mode: str = "FULL_DUPLEX_STREAMED"
    # "full": response headers, body and trailers go to Pointsman (usage tokens, served endpoint, SSE echo).
    # "lean": only the request phases; response trailers stay SEND so Envoy keeps the stream open until the
    # response ends, which keeps the in-flight counts exact with half the messages.
    response_phases: str = "full"
    message_timeout_s: int = 300
    upstream_timeout_s: int = 600
    buffer_limit_bytes: int = 64 * 1024 * 1024
    epp_tls: bool = False
    node_id: str = "pointsman-envoy"
    node_cluster: str = "pointsman"
    # The routing layer's additions (external provider clusters and routes, pool-route retries): an
    # epp.envoy_providers.RouteFragments, applied to the rendered bootstrap.
    route_fragments: Any = None

    def check(self) -> None:
        """Raise ValueError with a clear message for a combination Envoy could not run."""
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown Envoy config variant {self.variant!r}; expected one of {VARIANTS}")
        if self.response_phases not in ("full", "lean"):
            raise ValueError(f"response_phases must be 'full' or 'lean', got {self.response_phases!r}")
        if self.epp_workers < 1 or self.epp_max_streams_per_connection < 0 or self.epp_max_requests_per_connection < 0:
            raise ValueError("--epp-workers must be at least 1, and the per-connection limits 0 or more")
        if self.eds and self.variant != "override-host":
            raise ValueError("--eds feeds the override-host pool cluster; the original-dst variant has no "
                             "endpoint list (use --variant override-host)")
        if self.eds and self.endpoints:
            raise ValueError("--eds takes the endpoints from Pointsman; do not also list them (--endpoint)")
        if self.eds and not self.pool_name:
            raise ValueError("--eds needs the pool's name (the EDS resource Envoy subscribes to)")
        if self.variant == "override-host" and not self.eds and not self.endpoints:
            raise ValueError("the override-host variant needs the pool's endpoints (the policy picks among them): "
                             "give --endpoint / --endpoints-file, or --eds to have Pointsman serve them")
