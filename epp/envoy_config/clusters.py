"""The clusters of the bootstrap, as envoy-data-plane messages.

A pool cluster is assembled from two independent parts, so each can change without the other:
- where its endpoints come from (`discovery`): none (ORIGINAL_DST), a static list, or EDS served by Pointsman;
- how a host is chosen (`load balancing`): the destination header (ORIGINAL_DST), or the override_host policy
  reading `envoy.lb` metadata with a fallback policy (`fallback_policy`) for requests Pointsman did not route.
"""

from __future__ import annotations

import ipaddress

from envoy_data_plane.envoy.config.cluster.v3 import (
    CircuitBreakers,
    CircuitBreakersThresholds,
    Cluster,
    ClusterCommonLbConfig,
    ClusterDiscoveryType,
    ClusterEdsClusterConfig,
    ClusterLbPolicy,
    ClusterOriginalDstLbConfig,
    LoadBalancingPolicy,
    LoadBalancingPolicyPolicy,
)
from envoy_data_plane.envoy.config.core.v3 import (
    ApiConfigSource,
    ApiConfigSourceApiType,
    ApiVersion,
    BackoffStrategy,
    ConfigSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    HealthCheck,
    HealthCheckGrpcHealthCheck,
    RetryPolicy,
    TransportSocket,
    TypedExtensionConfig,
)
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy_data_plane.envoy.extensions.load_balancing_policies.least_request.v3 import LeastRequest
from envoy_data_plane.envoy.extensions.load_balancing_policies.override_host.v3 import (
    OverrideHost,
    OverrideHostOverrideHostSource,
)
from envoy_data_plane.envoy.extensions.load_balancing_policies.round_robin.v3 import RoundRobin
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import CommonTlsContext, UpstreamTlsContext
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.envoy.type.metadata.v3 import MetadataKey, MetadataKeyPathSegment
from envoy_data_plane.envoy.type.v3 import Percent
from envoy_data_plane.google.protobuf import Any

from epp.envoy_config.listener import (
    DESTINATION_KEY,
    EPP_CLUSTER,
    LB_NAMESPACE,
    POOL_CLUSTER,
    SERVED_KEY,
    seconds,
    socket,
)
from epp.envoy_config.spec import EnvoyConfigSpec

HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"  # Pointsman's readiness on the ext_proc port
CONNECT_TIMEOUT_S = 2


def _static_assignment(name: str, endpoints: list[tuple[str, int]]) -> ClusterLoadAssignment:
    lb = [LbEndpoint(endpoint=Endpoint(address=socket(a, p))) for a, p in endpoints]
    return ClusterLoadAssignment(cluster_name=name, endpoints=[LocalityLbEndpoints(lb_endpoints=lb)])


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _epp_health(spec: EnvoyConfigSpec) -> tuple[list[HealthCheck], ClusterCommonLbConfig]:
    """Fail-open: gRPC health checks of Pointsman (the ext_proc service name on the ext_proc port) and no panic
    routing, so a hung or draining Pointsman has no healthy host: streams to it fail at once and the requests go
    on to the fallback policy instead of waiting."""
    interval = spec.epp_health_interval_s
    check = HealthCheck(
        timeout=seconds(interval / 2),
        interval=seconds(interval),
        unhealthy_threshold=2,
        healthy_threshold=1,
        no_traffic_interval=seconds(interval),
        grpc_health_check=HealthCheckGrpcHealthCheck(service_name=EXT_PROC_SERVICE),
    )
    return [check], ClusterCommonLbConfig(healthy_panic_threshold=Percent(value=0.0))


def epp_cluster(spec: EnvoyConfigSpec) -> Cluster:
    """Pointsman's gRPC port over HTTP/2: the ext_proc streams and, with --eds, the EDS stream. Several replicas and
    workers: epp/envoy_config/replicas.py."""
    from epp.envoy_config.replicas import add_replica_health, common_options, epp_hosts, http2_options

    hosts = epp_hosts(spec)
    http2 = HttpProtocolOptions(explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
        http2_protocol_options=http2_options(spec)), common_http_protocol_options=common_options(spec))
    cluster = Cluster(
        name=EPP_CLUSTER,
        # An IP is dialled as is; a name (a Kubernetes Service, a compose host) is resolved by DNS.
        type=ClusterDiscoveryType.STATIC if all(_is_ip(h) for h, _ in hosts) else ClusterDiscoveryType.STRICT_DNS,
        connect_timeout=seconds(spec.epp_connect_timeout_s if spec.failure_mode == "open" else CONNECT_TIMEOUT_S),
        load_assignment=_static_assignment(EPP_CLUSTER, hosts),
        typed_extension_protocol_options={HTTP_OPTIONS_KEY: Any.pack(http2)},
        circuit_breakers=CircuitBreakers(thresholds=[
            CircuitBreakersThresholds(max_requests=100000, max_pending_requests=100000)]),
    )
    add_replica_health(spec, cluster)
    if spec.epp_tls:
        tls = UpstreamTlsContext(common_tls_context=CommonTlsContext(alpn_protocols=["h2"]))
        cluster.transport_socket = TransportSocket(name="envoy.transport_sockets.tls", typed_config=Any.pack(tls))
    if spec.failure_mode == "open":
        cluster.health_checks, cluster.common_lb_config = _epp_health(spec)
    return cluster


def _pool_breakers() -> CircuitBreakers:
    return CircuitBreakers(thresholds=[CircuitBreakersThresholds(
        max_requests=100000, max_pending_requests=100000, max_connections=100000)])


def eds_config(spec: EnvoyConfigSpec) -> ClusterEdsClusterConfig:
    """Subscribe to the pool's ClusterLoadAssignment on Pointsman's gRPC port (state-of-the-world EDS, v3)."""
    retry = RetryPolicy(retry_back_off=BackoffStrategy(base_interval=seconds(spec.eds_retry_base_s),
                                                       max_interval=seconds(spec.eds_retry_max_s)))
    source = ApiConfigSource(
        api_type=ApiConfigSourceApiType.GRPC,
        transport_api_version=ApiVersion.V3,
        grpc_services=[GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EPP_CLUSTER, retry_policy=retry))],
    )
    return ClusterEdsClusterConfig(
        eds_config=ConfigSource(api_config_source=source, resource_api_version=ApiVersion.V3),
        service_name=spec.pool_name,
    )


def fallback_policy(spec: EnvoyConfigSpec) -> LoadBalancingPolicy:
    """The policy override_host falls back to when a request carries no usable `envoy.lb` destination.

    Round robin over the cluster's endpoints; fail-open, where the fallback carries all the traffic while Pointsman
    is away, uses least request (the better of two random hosts by active requests), which spreads long LLM
    requests better. Both honour EDS health status (UNHEALTHY hosts are skipped, DEGRADED ones used only when too
    few are healthy)."""
    if spec.failure_mode == "open":
        lr = LeastRequest(choice_count=2)
        ext = TypedExtensionConfig(name="envoy.load_balancing_policies.least_request", typed_config=Any.pack(lr))
    else:
        ext = TypedExtensionConfig(name="envoy.load_balancing_policies.round_robin",
                                   typed_config=Any.pack(RoundRobin()))
    return LoadBalancingPolicy(policies=[LoadBalancingPolicyPolicy(typed_extension_config=ext)])


def override_host_policy(spec: EnvoyConfigSpec) -> LoadBalancingPolicy:
    """override_host reads Pointsman's pick (a comma list: the pick, then retries) from `envoy.lb` metadata and
    writes the host it used back under `x-gateway-destination-endpoint-served`."""
    policy = OverrideHost(
        override_host_sources=[OverrideHostOverrideHostSource(metadata=MetadataKey(
            key=LB_NAMESPACE, path=[MetadataKeyPathSegment(key=DESTINATION_KEY)]))],
        selected_host_key=MetadataKey(key=LB_NAMESPACE, path=[MetadataKeyPathSegment(key=SERVED_KEY)]),
        fallback_policy=fallback_policy(spec),
    )
    ext = TypedExtensionConfig(name="envoy.load_balancing_policies.override_host", typed_config=Any.pack(policy))
    return LoadBalancingPolicy(policies=[LoadBalancingPolicyPolicy(typed_extension_config=ext)])


def original_dst_cluster(spec: EnvoyConfigSpec) -> Cluster:
    """No endpoint list: Envoy connects to whatever `x-gateway-destination-endpoint` names."""
    return Cluster(
        name=POOL_CLUSTER,
        type=ClusterDiscoveryType.ORIGINAL_DST,
        lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED,
        connect_timeout=seconds(CONNECT_TIMEOUT_S),
        original_dst_lb_config=ClusterOriginalDstLbConfig(use_http_header=True, http_header_name=DESTINATION_KEY),
        circuit_breakers=_pool_breakers(),
    )


def override_host_cluster(spec: EnvoyConfigSpec) -> Cluster:
    """The pool's endpoints (a static list, or EDS from Pointsman) under the override_host policy."""
    cluster = Cluster(
        name=POOL_CLUSTER,
        connect_timeout=seconds(CONNECT_TIMEOUT_S),
        load_balancing_policy=override_host_policy(spec),
        circuit_breakers=_pool_breakers(),
    )
    if spec.eds:
        cluster.type = ClusterDiscoveryType.EDS
        cluster.eds_cluster_config = eds_config(spec)
    else:
        cluster.type = ClusterDiscoveryType.STATIC
        cluster.load_assignment = _static_assignment(POOL_CLUSTER, spec.endpoints)
    return cluster


def pool_cluster(spec: EnvoyConfigSpec) -> Cluster:
    if spec.variant == "original-dst":
        return original_dst_cluster(spec)
    return override_host_cluster(spec)
