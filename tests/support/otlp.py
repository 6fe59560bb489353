"""Real OTLP trace receivers for the tests: a gRPC TraceService server and an HTTP /v1/traces endpoint, both on
loopback in the test's event loop, keeping every span they are sent (decoded from the wire, with its resource)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from tests.support.envoy import free_port
from tests.support.wait import until


@dataclass
class Received:
    service: str  # the resource's service.name
    span: Any  # opentelemetry.proto.trace.v1.trace_pb2.Span

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    @property
    def name(self) -> str:
        return self.span.name

    def attrs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kv in self.span.attributes:
            v = kv.value
            out[kv.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
        return out


def _keep(req: ts.ExportTraceServiceRequest, into: list[Received]) -> None:
    for rs in req.resource_spans:
        service = next((kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name"), "")
        for ss in rs.scope_spans:
            for span in ss.spans:
                into.append(Received(service, span))


class _Receivers:
    spans: list[Received]
    requests: int

    async def wait_for(self, predicate: Any, timeout: float = 20.0) -> list[Received]:
        """Wait until `predicate(spans)` is true; returns the spans (fails with what arrived)."""
        await until(lambda: predicate(self.spans), timeout,
                    lambda: f"the spans; received: {[(r.service, r.name) for r in self.spans]}", interval=0.05)
        return self.spans


class GrpcReceiver(ts_grpc.TraceServiceServicer, _Receivers):
    """opentelemetry.proto.collector.trace.v1.TraceService/Export on a grpc.aio server."""

    def __init__(self) -> None:
        self.spans = []
        self.requests = 0
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def Export(self, request: ts.ExportTraceServiceRequest, context: Any  # noqa: N802
                     ) -> ts.ExportTraceServiceResponse:
        self.requests += 1
        _keep(request, self.spans)
        return ts.ExportTraceServiceResponse()

    async def start(self) -> int:
        self.server = grpc.aio.server()
        ts_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self.port

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)


class HttpReceiver(_Receivers):
    """POST /v1/traces with a protobuf ExportTraceServiceRequest body (OTLP/HTTP)."""

    def __init__(self) -> None:
        self.spans = []
        self.requests = 0
        self.content_types: list[str] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def _traces(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.content_types.append(request.headers.get("Content-Type", ""))
        req = ts.ExportTraceServiceRequest()
        req.ParseFromString(await request.read())
        _keep(req, self.spans)
        return web.Response(body=ts.ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def start(self) -> int:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self.port

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
