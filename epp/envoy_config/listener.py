"""The listener side of the bootstrap, as envoy-data-plane messages: HTTP connection manager, ext_proc, router."""

from __future__ import annotations

from datetime import timedelta

from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    SocketAddress,
)
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.route.v3 import (
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
    HttpFilter,
)
from envoy_data_plane.google.protobuf import Any

from epp.envoy_config.spec import EnvoyConfigSpec

EPP_CLUSTER = "epp"
POOL_CLUSTER = "pool"
LB_NAMESPACE = "envoy.lb"
RECEIPT_NAMESPACE = "pointsman"
DESTINATION_KEY = "x-gateway-destination-endpoint"
SERVED_KEY = "x-gateway-destination-endpoint-served"


def socket(address: str, port: int) -> Address:
    return Address(socket_address=SocketAddress(address=address, port_value=port))


def seconds(s: float) -> timedelta:
    return timedelta(seconds=s)


def _body_mode(name: str) -> ProcessingModeBodySendMode:
    try:
        return ProcessingModeBodySendMode[name]
    except KeyError:
        raise ValueError(f"unknown ext_proc body mode {name!r}; expected one of "
                         f"{[m.name for m in ProcessingModeBodySendMode]}") from None


def ext_proc_filter(spec: EnvoyConfigSpec) -> ExternalProcessor:
    """The ext_proc filter: all request phases, trailers SEND, and `envoy.lb` metadata accepted from Pointsman."""
    full = spec.response_phases == "full"
    request_mode, response_mode = spec.body_modes()
    send, skip = ProcessingModeHeaderSendMode.SEND, ProcessingModeHeaderSendMode.SKIP
    mode = ProcessingMode(
        request_header_mode=send,
        response_header_mode=send if spec.response_phases in ("full", "headers") else skip,
        request_body_mode=_body_mode(request_mode),
        response_body_mode=_body_mode(response_mode) if full else ProcessingModeBodySendMode.NONE,
        request_trailer_mode=send,
        response_trailer_mode=send,
    )
    return ExternalProcessor(
        grpc_service=GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EPP_CLUSTER),
                                 timeout=seconds(spec.message_timeout())),
        processing_mode=mode,
        message_timeout=seconds(spec.message_timeout()),
        # open: a stream that cannot be opened or fails lets the request go on unrouted, to the fallback policy
        failure_mode_allow=spec.failure_mode == "open",
        allow_mode_override=False,
        metadata_options=MetadataOptions(
            # envoy.lb: the pick; pointsman: the decision id, for the access log (epp/observe/receipts.py)
            receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=[LB_NAMESPACE, RECEIPT_NAMESPACE]),
            forwarding_namespaces=MetadataOptionsMetadataNamespaces(
                untyped=[LB_NAMESPACE, "envoy.lb.subset_hint"]),
        ),
    )


def connection_manager(spec: EnvoyConfigSpec, ext_proc: ExternalProcessor) -> HttpConnectionManager:
    route = Route(match=RouteMatch(prefix="/"),
                  route=RouteAction(cluster=POOL_CLUSTER, timeout=seconds(spec.upstream_timeout_s)))
    return HttpConnectionManager(
        stat_prefix="pointsman",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        stream_idle_timeout=seconds(spec.upstream_timeout_s),
        route_config=RouteConfiguration(
            name="inference",
            virtual_hosts=[VirtualHost(name="inference", domains=["*"], routes=[route])],
        ),
        http_filters=[
            HttpFilter(name="envoy.filters.http.ext_proc", typed_config=Any.pack(ext_proc)),
            HttpFilter(name="envoy.filters.http.router", typed_config=Any.pack(Router())),
        ],
    )


def listener(spec: EnvoyConfigSpec, hcm: HttpConnectionManager) -> Listener:
    return Listener(
        name="inference",
        address=socket(spec.listen_address, spec.listen_port),
        per_connection_buffer_limit_bytes=spec.buffer_limit_bytes,
        filter_chains=[FilterChain(filters=[
            Filter(name="envoy.filters.network.http_connection_manager", typed_config=Any.pack(hcm)),
        ])],
    )
