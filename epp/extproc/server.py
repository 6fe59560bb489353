"""The gRPC server for the ext_proc port: ExternalProcessor on the chosen transport, plus Pointsman's own API.

`build_server` makes either transport's server: "h2" (epp/h2grpc with the callback-driven ext_proc calls of
epp/extproc/h2.py, the default) or "grpcio" (grpc.aio with epp/extproc/aio.py). Both drive each stream through one
`StreamSession` (epp/extproc/session.py), and both offer the grpc.aio.Server calls the shell uses (add_*_port,
start, stop, the generated add_*_to_server functions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.extproc.session import ProtocolMetrics, StreamConfig
from epp.extproc.settings import DEFAULT_TRANSPORT, TRANSPORTS
from epp.h2grpc import ServerLimits, grpcio_options

if TYPE_CHECKING:
    from epp.request import Director


def grpc_options(reuse_port: bool = False, limits: ServerLimits | None = None) -> list[tuple[str, int]]:
    """`reuse_port`: the workers of `epp serve --workers N` share one port (SO_REUSEPORT); otherwise a port in use
    is an error, never silently shared. `limits`: the h2 transport's, as far as grpc has options for them."""
    return [("grpc.so_reuseport", 1 if reuse_port else 0), *grpcio_options(limits or ServerLimits())]


def build_server(
    director: Director,
    stream_config: StreamConfig | None = None,
    *,
    metrics: ProtocolMetrics | None = None,
    extra_servicers: list[Callable[[Any], object]] | None = None,
    transport: str = DEFAULT_TRANSPORT,
    reuse_port: bool = False,
    limits: ServerLimits | None = None,
) -> tuple[Any, Any]:
    """The gRPC server carrying ExternalProcessor and the `extra_servicers` (each adds itself to the server:
    Pointsman's own API, EDS); ports are added by the caller. Returns (server, ext_proc service). The services hold
    the director, which the app swaps on reload.

    `transport`: "h2" (epp.h2grpc: HTTP/2 on asyncio, the ext_proc calls callback-driven) or "grpcio" (grpc.aio).
    Both offer the grpc.aio.Server calls the shell uses (add_*_port, start, stop, generated add_*_to_server)."""
    if transport == "h2":
        from epp.extproc.h2 import PROCESS_PATH, ExtProcH2
        from epp.h2grpc import H2Server

        h2server = H2Server(reuse_port=reuse_port, limits=limits)
        h2svc = ExtProcH2(director, stream_config or StreamConfig(), metrics)
        h2server.add_native_method(PROCESS_PATH, h2svc.call)
        server: Any = h2server
        svc: Any = h2svc
    elif transport == "grpcio":
        server = grpc.aio.server(options=grpc_options(reuse_port, limits))
        from epp.extproc.aio import ExtProcService

        svc = ExtProcService(director, stream_config or StreamConfig(), metrics)
        pb_grpc.add_ExternalProcessorServicer_to_server(svc, server)
    else:
        raise ValueError(f"unknown gRPC transport {transport!r}; expected one of {TRANSPORTS}")
    for add in extra_servicers or []:
        add(server)
    return server, svc
