"""The `epp` cluster for several Pointsman replicas and for replicas with several workers.

- Replicas: every address is a host of the `epp` cluster; Envoy opens each ext_proc stream on the next host
  (round robin), so each of N replicas gets 1/N of the streams. An IP is dialled as is; with a DNS name the cluster
  is STRICT_DNS, and a headless Service's name resolves to every replica.
- Workers (`epp serve --workers W`): W processes accept on one port with SO_REUSEPORT, and the kernel hands each
  new *connection* to one of them; every stream on a connection then goes to that worker. Envoy keeps one HTTP/2
  connection per upstream host per Envoy worker thread and puts every stream on it, so without more connections
  one Pointsman worker could get all the streams. Two settings fix that:
  * `max_concurrent_streams` per connection (default 8 with W > 1): past that many open streams Envoy opens
    another connection, so connections grow with the load, and with many connections the kernel's hash spreads
    them (and their streams) evenly over the workers;
  * `max_requests_per_connection` (default 1000 with W > 1): a connection is replaced after that many streams, so
    the spread keeps being re-drawn, and a worker that was restarted gets its share back within seconds.
  Both are cheap: a new HTTP/2 connection per 1000 requests, and a few connections per Envoy thread.
- Health: with several replicas, each host is health-checked with gRPC health (the readiness services Pointsman
  answers) every second, and a host that refuses connections is ejected at once (outlier detection on local-origin
  failures), so a replica that dies stops receiving new streams within about a second.
"""

from __future__ import annotations

from envoy_data_plane.envoy.config.cluster.v3 import Cluster, OutlierDetection
from envoy_data_plane.envoy.config.core.v3 import (
    HealthCheck,
    HealthCheckGrpcHealthCheck,
    Http2ProtocolOptions,
    HttpProtocolOptions,
)

from epp.envoy_config.spec import EnvoyConfigSpec

WORKER_STREAMS_PER_CONNECTION = 8
WORKER_REQUESTS_PER_CONNECTION = 1000
HEALTH_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"  # Pointsman's readiness, on the ext_proc port


def epp_hosts(spec: EnvoyConfigSpec) -> list[tuple[str, int]]:
    hosts = [(spec.epp_host, spec.epp_port)]
    for h in spec.epp_replicas:
        if h not in hosts:
            hosts.append(h)
    return hosts


def http2_options(spec: EnvoyConfigSpec) -> Http2ProtocolOptions:
    streams = spec.epp_max_streams_per_connection
    if not streams and spec.epp_workers > 1:
        streams = WORKER_STREAMS_PER_CONNECTION
    return Http2ProtocolOptions(max_concurrent_streams=streams) if streams else Http2ProtocolOptions()


def common_options(spec: EnvoyConfigSpec) -> HttpProtocolOptions | None:
    requests = spec.epp_max_requests_per_connection
    if not requests and spec.epp_workers > 1:
        requests = WORKER_REQUESTS_PER_CONNECTION
    return HttpProtocolOptions(max_requests_per_connection=requests) if requests else None


def add_replica_health(spec: EnvoyConfigSpec, cluster: Cluster) -> None:
    """With several replicas: active gRPC health checks and immediate ejection of a host that refuses."""
    if len(epp_hosts(spec)) < 2:
        return
    from datetime import timedelta

    cluster.health_checks = [HealthCheck(
        timeout=timedelta(seconds=1), interval=timedelta(seconds=1), unhealthy_threshold=1, healthy_threshold=1,
        grpc_health_check=HealthCheckGrpcHealthCheck(service_name=HEALTH_SERVICE))]
    cluster.outlier_detection = OutlierDetection(
        split_external_local_origin_errors=True, consecutive_local_origin_failure=1,
        base_ejection_time=timedelta(seconds=5), max_ejection_percent=100, interval=timedelta(seconds=1))
