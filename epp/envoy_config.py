"""Envoy bootstrap configs that put Pointsman in front of a pool, rendered for given addresses.

Two variants, both with the ext_proc filter in FULL_DUPLEX_STREAMED and trailers SEND (as GIE's reference config):
- `original-dst`: an ORIGINAL_DST cluster routed by the `x-gateway-destination-endpoint` header (one address).
- `override-host`: a STATIC cluster of the pool's endpoints with the override_host load-balancing policy reading
  `envoy.lb/x-gateway-destination-endpoint` metadata (a comma list, later entries for retries), with
  `metadata_options.receiving_namespaces` set so the metadata is not dropped, and the served host written back to
  `envoy.lb/x-gateway-destination-endpoint-served`.

The configs are plain dicts rendered to YAML and checked by `envoy --mode validate` in the tests; typed
envoy-data-plane classes would only add a slow dependency here without catching more than Envoy itself does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

VARIANTS = ("original-dst", "override-host")
_T = "@type"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
OVERRIDE_HOST = "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost"
ROUND_ROBIN = "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"


@dataclass
class EnvoyConfigSpec:
    variant: str = "original-dst"
    listen_port: int = 8081
    listen_address: str = "127.0.0.1"
    admin_port: int = 9901
    epp_host: str = "127.0.0.1"
    epp_port: int = 9002
    endpoints: list[tuple[str, int]] = field(default_factory=list)  # override-host: the pool's endpoints
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
    # HOOK (routing layer): provider clusters and routes, pool-route retries; an epp.envoy_providers.RouteFragments.
    route_fragments: Any = None


def _socket(address: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": address, "port_value": port}}


def _ext_proc(spec: EnvoyConfigSpec) -> dict[str, Any]:
    if spec.response_phases not in ("full", "lean"):
        raise ValueError(f"response_phases must be 'full' or 'lean', got {spec.response_phases!r}")
    full = spec.response_phases == "full"
    mode = {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND" if full else "SKIP",
        "request_body_mode": spec.request_body_mode,
        "response_body_mode": spec.response_body_mode if full else "NONE",
        "request_trailer_mode": "SEND",
        "response_trailer_mode": "SEND",
    }
    cfg: dict[str, Any] = {
        _T: EXT_PROC,
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": f"{spec.message_timeout_s}s"},
        "processing_mode": mode,
        "message_timeout": f"{spec.message_timeout_s}s",
        "failure_mode_allow": False,
        "allow_mode_override": False,
        "metadata_options": {
            "receiving_namespaces": {"untyped": ["envoy.lb"]},
            "forwarding_namespaces": {"untyped": ["envoy.lb", "envoy.lb.subset_hint"]},
        },
    }
    return cfg


def _epp_cluster(spec: EnvoyConfigSpec) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": "epp",
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": "epp",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _socket(spec.epp_host, spec.epp_port)}}]}],
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                _T: HTTP_OPTS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "circuit_breakers": {"thresholds": [{"max_requests": 100000, "max_pending_requests": 100000}]},
    }
    if spec.epp_tls:
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                _T: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {"alpn_protocols": ["h2"]},
            },
        }
    return cluster


def _pool_cluster(spec: EnvoyConfigSpec) -> dict[str, Any]:
    breakers = {"thresholds": [{"max_requests": 100000, "max_pending_requests": 100000, "max_connections": 100000}]}
    if spec.variant == "original-dst":
        return {
            "name": "pool",
            "type": "ORIGINAL_DST",
            "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": "2s",
            "original_dst_lb_config": {
                "use_http_header": True,
                "http_header_name": "x-gateway-destination-endpoint",
            },
            "circuit_breakers": breakers,
        }
    if spec.variant != "override-host":
        raise ValueError(f"unknown Envoy config variant {spec.variant!r}; expected one of {VARIANTS}")
    if not spec.endpoints:
        raise ValueError("the override-host variant needs the pool's endpoints (the policy picks among them)")
    lb_endpoints = [{"endpoint": {"address": _socket(a, p)}} for a, p in spec.endpoints]
    return {
        "name": "pool",
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": lb_endpoints}]},
        "load_balancing_policy": {
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.override_host",
                        "typed_config": {
                            _T: OVERRIDE_HOST,
                            "override_host_sources": [
                                {"metadata": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}}
                            ],
                            "selected_host_key": {
                                "key": "envoy.lb",
                                "path": [{"key": "x-gateway-destination-endpoint-served"}],
                            },
                            "fallback_policy": {
                                "policies": [
                                    {
                                        "typed_extension_config": {
                                            "name": "envoy.load_balancing_policies.round_robin",
                                            "typed_config": {_T: ROUND_ROBIN},
                                        }
                                    }
                                ]
                            },
                        },
                    }
                }
            ]
        },
        "circuit_breakers": breakers,
    }


def render(spec: EnvoyConfigSpec) -> dict[str, Any]:
    hcm = {
        _T: HCM,
        "stat_prefix": "pointsman",
        "codec_type": "AUTO",
        "stream_idle_timeout": f"{spec.upstream_timeout_s}s",
        "route_config": {
            "name": "inference",
            "virtual_hosts": [
                {
                    "name": "inference",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {"cluster": "pool", "timeout": f"{spec.upstream_timeout_s}s"},
                        }
                    ],
                }
            ],
        },
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": _ext_proc(spec)},
            {"name": "envoy.filters.http.router", "typed_config": {_T: ROUTER}},
        ],
    }
    bootstrap = {
        "admin": {"address": _socket("127.0.0.1", spec.admin_port)},
        "static_resources": {
            "listeners": [
                {
                    "name": "inference",
                    "address": _socket(spec.listen_address, spec.listen_port),
                    "per_connection_buffer_limit_bytes": spec.buffer_limit_bytes,
                    "filter_chains": [
                        {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
                    ],
                }
            ],
            "clusters": [_epp_cluster(spec), _pool_cluster(spec)],
        },
    }
    # HOOK (routing layer): add the provider clusters/routes and pool retries of epp/envoy_providers.py.
    if spec.route_fragments is not None:
        spec.route_fragments.apply(bootstrap)
    return bootstrap


def render_yaml(spec: EnvoyConfigSpec) -> str:
    header = f"# Envoy bootstrap for Pointsman ({spec.variant}); generated by `epp envoy-config`.\n"
    return header + yaml.safe_dump(render(spec), sort_keys=False)
