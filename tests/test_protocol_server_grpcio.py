"""The grpc-layer protocol tests of test_protocol_server.py, run again on the grpc.aio transport
(`--grpc-transport grpcio`); that module runs them on the default h2 transport."""

from __future__ import annotations

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.director import Director
from epp.metrics import EppMetrics
from epp.server import ExtProcService, build_server
from tests.test_protocol_server import (  # noqa: F401 - collected here with the grpcio `serve` below
    test_a_failing_awaitable_decision_is_a_500_and_closes_once,
    test_a_local_reply_while_the_decision_is_pending_abandons_it,
    test_a_stream_that_ends_while_the_decision_is_pending,
    test_a_violation_while_the_decision_is_pending_cancels_it,
    test_an_awaitable_decision_that_completes_later,
    test_duplicated_end_of_stream_headers_leave_no_phantom_inflight,
    test_messages_that_arrive_while_the_decision_is_pending_keep_their_order,
    test_violation_reply_on_the_wire,
)


@pytest.fixture
async def serve():
    servers = []

    async def start(director: Director) -> tuple[pb_grpc.ExternalProcessorStub, EppMetrics]:
        metrics = EppMetrics()
        server, svc = build_server(director, metrics=metrics, transport="grpcio")
        assert isinstance(server, grpc.aio.Server) and isinstance(svc, ExtProcService)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        servers.append((server, channel))
        return pb_grpc.ExternalProcessorStub(channel), metrics

    yield start
    for server, channel in servers:
        await channel.close()
        await server.stop(0)
