"""An ext_proc relay between a real Envoy and Pointsman that re-encodes Envoy's messages the way agentgateway's
ext_proc client sends them: header values in `value` (agentgateway puts pseudo-headers such as :path and :method
there, never in `raw_value`). Everything else passes unchanged, both ways, message by message.

    relay = AgentgatewayRelay(upstream="127.0.0.1:<pointsman port>")
    port = await relay.start()          # point Envoy's ext_proc cluster here
    ...
    relay.rewritten                     # how many header values were moved to `value`
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc


def agentgateway_encoding(req: pb.ProcessingRequest) -> pb.ProcessingRequest:
    """The same message with every header value in `value` (UTF-8), `raw_value` empty."""
    out = pb.ProcessingRequest()
    out.CopyFrom(req)
    for phase in ("request_headers", "response_headers", "request_trailers", "response_trailers"):
        if not out.HasField(phase):
            continue
        part = getattr(out, phase)
        hmap = part.headers if phase.endswith("headers") else part.trailers
        for h in hmap.headers:
            if h.raw_value:
                h.value = h.raw_value.decode("utf-8", "replace")
                h.raw_value = b""
    return out


class AgentgatewayRelay(pb_grpc.ExternalProcessorServicer):
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.server: grpc.aio.Server | None = None
        self.channel: grpc.aio.Channel | None = None
        self.streams = 0
        self.rewritten = 0

    async def start(self) -> int:
        self.channel = grpc.aio.insecure_channel(self.upstream)
        self.server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
        if self.channel is not None:
            await self.channel.close()

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest],  # noqa: N802
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ProcessingResponse]:
        assert self.channel is not None
        self.streams += 1
        stub = pb_grpc.ExternalProcessorStub(self.channel)
        queue: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for req in request_iterator:
                    before = sum(1 for p in ("request_headers", "response_headers") if req.HasField(p))
                    out = agentgateway_encoding(req)
                    self.rewritten += before
                    await queue.put(out)
            finally:
                await queue.put(None)

        async def requests() -> AsyncIterator[pb.ProcessingRequest]:
            while (item := await queue.get()) is not None:
                yield item

        task = asyncio.get_running_loop().create_task(pump())
        try:
            async for resp in stub.Process(requests()):
                yield resp
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
