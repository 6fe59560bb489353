"""Envoy's side of observability in a generated bootstrap: its own tracing, and an access log with the decision id.

- `tracing_collector` (`epp envoy-config --tracing-collector HOST:PORT`): the HTTP connection manager traces with
  the OpenTelemetry tracer (`envoy.tracers.opentelemetry`), exporting OTLP/gRPC to that collector (the one
  Pointsman's `--tracing-endpoint` names) through the `otel_collector` cluster. Envoy's span becomes the parent of
  Pointsman's: the ext_proc filter opens its `Process` stream under an egress span and puts that span's context in
  the stream's gRPC metadata (docs/observability.md).
- `access_log` (`--access-log PATH`, e.g. /dev/stdout): a file access log whose line carries the decision id from
  the `pointsman` dynamic-metadata namespace (`ACCESS_LOG_FORMAT`); the ext_proc filter accepts that namespace in
  every generated config (epp/envoy_config/listener.py).
"""

from __future__ import annotations

import ipaddress

from envoy_data_plane.envoy.config.accesslog.v3 import AccessLog
from envoy_data_plane.envoy.config.cluster.v3 import Cluster, ClusterDiscoveryType
from envoy_data_plane.envoy.config.core.v3 import (
    DataSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    Http2ProtocolOptions,
    SubstitutionFormatString,
)
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy_data_plane.envoy.config.trace.v3 import OpenTelemetryConfig, TracingHttp
from envoy_data_plane.envoy.extensions.access_loggers.file.v3 import FileAccessLog
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerTracing,
)
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.envoy.type.v3 import Percent
from envoy_data_plane.google.protobuf import Any

from epp.envoy_config.listener import seconds, socket
from epp.envoy_config.spec import EnvoyConfigSpec

COLLECTOR_CLUSTER = "otel_collector"
HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
ACCESS_LOG_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
    "%RESPONSE_FLAGS% %DURATION%ms upstream=%UPSTREAM_HOST% decision=%DYNAMIC_METADATA(pointsman:decision_id)% "
    'trace=%TRACE_ID% request=%REQ(X-REQUEST-ID)%\n'
)


def apply(spec: EnvoyConfigSpec, hcm: HttpConnectionManager) -> None:
    """Add Envoy's tracing and the access log to the connection manager, as the spec asks."""
    if spec.tracing_collector is not None:
        otel = OpenTelemetryConfig(
            grpc_service=GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=COLLECTOR_CLUSTER),
                                     timeout=seconds(1)),
            service_name=spec.tracing_service_name,
        )
        hcm.tracing = HttpConnectionManagerTracing(
            provider=TracingHttp(name="envoy.tracers.opentelemetry", typed_config=Any.pack(otel)),
            random_sampling=Percent(value=spec.tracing_sampling),
        )
    if spec.access_log:
        log = FileAccessLog(path=spec.access_log, log_format=SubstitutionFormatString(
            text_format_source=DataSource(inline_string=ACCESS_LOG_FORMAT)))
        hcm.access_log = [AccessLog(name="envoy.access_loggers.file", typed_config=Any.pack(log))]


def collector_cluster(spec: EnvoyConfigSpec) -> Cluster | None:
    """The OTLP/gRPC collector's cluster (HTTP/2), when Envoy traces."""
    if spec.tracing_collector is None:
        return None
    host, port = spec.tracing_collector
    try:
        ipaddress.ip_address(host)
        kind = ClusterDiscoveryType.STATIC
    except ValueError:
        kind = ClusterDiscoveryType.STRICT_DNS
    http2 = HttpProtocolOptions(explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
        http2_protocol_options=Http2ProtocolOptions()))
    return Cluster(
        name=COLLECTOR_CLUSTER,
        type=kind,
        connect_timeout=seconds(1),
        load_assignment=ClusterLoadAssignment(cluster_name=COLLECTOR_CLUSTER, endpoints=[LocalityLbEndpoints(
            lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=socket(host, port)))])]),
        typed_extension_protocol_options={HTTP_OPTIONS_KEY: Any.pack(http2)},
    )
