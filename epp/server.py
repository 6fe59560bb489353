"""The thin gRPC layer: ext_proc streams in, protocol machine replies out; plus Pointsman's own API.

Every stream ends with exactly one `exchange.close()`, whether it finished, was cancelled by Envoy, or broke.
A bug inside the machine becomes an ImmediateResponse 500 on that stream, never a crashed server or a hung stream.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.director import Director
from epp.explain import PointsmanService
from epp.protocol import BodyMode, RequestMachine, immediate
from proto import pointsman_pb2_grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 128 * 1024 * 1024  # well above gRPC's 4 MiB default, on both directions


@dataclass(slots=True)
class StreamConfig:
    request_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    response_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    max_body_bytes: int = 64 * 1024 * 1024


class ExtProcService(pb_grpc.ExternalProcessorServicer):
    def __init__(self, director: Director, config: StreamConfig | None = None) -> None:
        self.director = director
        self.config = config or StreamConfig()

    async def Process(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> None:
        cfg = self.config
        exchange = self.director.exchange()
        machine = RequestMachine(
            exchange,
            request_body_mode=cfg.request_body_mode,
            response_body_mode=cfg.response_body_mode,
            max_body_bytes=cfg.max_body_bytes,
        )
        try:
            while True:
                req = await context.read()
                if req is grpc.aio.EOF:
                    break
                try:
                    replies = machine.feed(req)
                except Exception as exc:
                    log.exception("ext_proc protocol failure")
                    await context.write(immediate(500, f"inference error: Internal - {exc}"))
                    break
                for reply in replies:
                    await context.write(reply)
                if machine.finished:
                    break
        finally:
            exchange.close()


def grpc_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def build_server(
    director: Director,
    stream_config: StreamConfig | None = None,
    *,
    extra_servicers: list | None = None,
) -> tuple[grpc.aio.Server, ExtProcService]:
    """A grpc.aio server carrying ExternalProcessor and the Pointsman API (ports are added by the caller)."""
    server = grpc.aio.server(options=grpc_options())
    svc = ExtProcService(director, stream_config)
    pb_grpc.add_ExternalProcessorServicer_to_server(svc, server)
    pointsman_pb2_grpc.add_PointsmanServicer_to_server(PointsmanService(director), server)
    for add in extra_servicers or []:
        add(server)
    return server, svc
