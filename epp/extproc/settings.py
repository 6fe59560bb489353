"""`epp serve`'s server flags, parsed once: the ports, TLS, the gRPC transport, and how streams are read.

`ServerSettings.limits` are the gRPC server's transport limits (the "gRPC server limits" flag group and its dataclass
in epp/h2grpc/limits.py: what one client may make the server spend; docs/frontdoor.md).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from epp.argtypes import parse_bool, parse_duration_arg
from epp.h2grpc import ServerLimits
from epp.h2grpc import add_limit_flags as _add_limit_flags
from epp.h2grpc import limits_from_args as _limits_from_args
from epp.protocol import BodyMode

TRANSPORTS = ("h2", "grpcio")  # the gRPC servers the ext_proc port can run on
DEFAULT_TRANSPORT = "h2"


def add_flags(g: argparse._ActionsContainer) -> None:
    """The "ports" group."""
    g.add_argument("--grpc-host", default="0.0.0.0", help="address the ext_proc gRPC server binds")
    g.add_argument("--grpc-port", type=int, default=9002, help="ext_proc + Pointsman API gRPC port (9002)")
    g.add_argument("--grpc-health-port", type=int, default=9003, help="grpc.health.v1 port (9003); 0 disables")
    g.add_argument("--metrics-port", type=int, default=9090, help="Prometheus port (9090); 0 disables")
    g.add_argument("--secure-serving", type=parse_bool, default=True,
                   help="serve TLS on the gRPC port (default true, as GIE's EPP; gateways connect without verifying)")
    g.add_argument("--cert-path", default=None, help="directory with tls.crt/tls.key (self-signed when absent)")
    g.add_argument("--enable-cert-reload", type=parse_bool, default=False,
                   help="reload tls.crt/tls.key from --cert-path when they change (a rotated Secret)")
    g.add_argument("--grpc-transport", choices=TRANSPORTS, default=DEFAULT_TRANSPORT,
                   help="gRPC server for the --grpc-port: h2 (HTTP/2 on asyncio, the default: about a third of "
                        "grpc.aio's CPU per ext_proc request) or grpcio (grpc.aio); see docs/performance.md")
    g.add_argument("--eds", type=parse_bool, default=True,
                   help="serve the pools' endpoints to Envoy over EDS on the gRPC port (default true)")


def add_limit_flags(g: argparse._ActionsContainer) -> None:
    """The "gRPC server limits" group: one flag per limit (epp/h2grpc/limits.py)."""
    _add_limit_flags(g, parse_duration_arg)


def add_stream_flags(g: argparse._ActionsContainer) -> None:
    """How ext_proc streams are read (in the "protocol" group)."""
    g.add_argument("--request-body-mode", type=BodyMode.parse, default=BodyMode.FULL_DUPLEX_STREAMED)
    g.add_argument("--response-body-mode", type=BodyMode.parse, default=BodyMode.FULL_DUPLEX_STREAMED)
    g.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024, help="413 above this (64 MiB)")


@dataclass(slots=True, frozen=True)
class StreamConfig:
    """How each ext_proc stream is read (epp/extproc/session.py)."""

    request_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    response_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    max_body_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    grpc_host: str = "0.0.0.0"
    grpc_port: int = 9002
    health_port: int = 9003  # 0: no separate grpc.health.v1 port
    metrics_port: int = 9090  # 0: no Prometheus port (nor dashboard, outside a worker)
    secure: bool = True  # TLS on the gRPC port (--secure-serving, GIE's default)
    cert_path: str | None = None  # with `secure`: tls.crt/tls.key; None: self-signed
    cert_reload: bool = False  # --enable-cert-reload: watch cert_path
    transport: str = "h2"
    eds: bool = True
    stream: StreamConfig = field(default_factory=StreamConfig)
    limits: ServerLimits = field(default_factory=ServerLimits)  # what one client may make the server spend

    @property
    def address(self) -> str:
        return f"{self.grpc_host}:{self.grpc_port}"

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ServerSettings:
        if ns.enable_cert_reload and not (ns.secure_serving and ns.cert_path):
            raise ValueError("--enable-cert-reload reloads the pair in --cert-path: it needs --cert-path and "
                             "--secure-serving")
        return cls(grpc_host=ns.grpc_host, grpc_port=ns.grpc_port, health_port=ns.grpc_health_port,
                   metrics_port=ns.metrics_port, secure=ns.secure_serving, cert_path=ns.cert_path,
                   cert_reload=ns.enable_cert_reload,
                   transport=ns.grpc_transport, eds=ns.eds,
                   stream=StreamConfig(ns.request_body_mode, ns.response_body_mode, ns.max_body_bytes),
                   limits=_limits_from_args(ns))


__all__ = ["TRANSPORTS", "ServerSettings", "StreamConfig", "add_flags", "add_limit_flags", "add_stream_flags"]
