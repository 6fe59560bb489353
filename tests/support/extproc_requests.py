"""An Envoy-shaped ext_proc client over real gRPC: open a request (headers + body, FULL_DUPLEX_STREAMED, as Envoy
sends them), read the pick, keep the stream open while the request is "in flight", then end it."""

from __future__ import annotations

import grpc
import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.protocol import BodyMode
from tests.support.extproc import body_msg, headers_msg

DEST = "x-gateway-destination-endpoint"


def chat(prompt: str, model: str = "llama", **extra: object) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], **extra})


class Request:
    def __init__(self, call: grpc.aio.StreamStreamCall, endpoint: str) -> None:
        self.call = call
        self.endpoint = endpoint

    async def finish(self) -> None:
        """End the stream, as Envoy does when the response is over (the EPP releases its in-flight count)."""
        await self.call.done_writing()
        while await self.call.read() is not grpc.aio.EOF:
            pass


async def open_request(stub: pb_grpc.ExternalProcessorStub, body: bytes, **headers: str) -> Request:
    """Send a request's headers and body; return once the EPP named the endpoint. Raises on an immediate reply."""
    call = stub.Process()
    await call.write(headers_msg(mode=BodyMode.FULL_DUPLEX_STREAMED, **headers))
    await call.write(body_msg(body, True))
    while True:
        resp = await call.read()
        if resp is grpc.aio.EOF:
            raise RuntimeError("the EPP ended the stream without a pick")
        if resp.HasField("immediate_response"):
            raise RuntimeError(f"immediate response {resp.immediate_response.status.code}: "
                               f"{resp.immediate_response.body[:200]!r}")
        if resp.HasField("request_headers"):
            for opt in resp.request_headers.response.header_mutation.set_headers:
                if opt.header.key == DEST:
                    return Request(call, opt.header.raw_value.decode())


async def route(stub: pb_grpc.ExternalProcessorStub, body: bytes, **headers: str) -> str:
    """One whole request: the endpoint it was routed to."""
    req = await open_request(stub, body, **headers)
    await req.finish()
    return req.endpoint


def stub_for(port: int) -> tuple[grpc.aio.Channel, pb_grpc.ExternalProcessorStub]:
    """A channel with its own TCP connection (gRPC shares one connection among equal channels of a process
    otherwise; SO_REUSEPORT spreads connections, so a test of spreading needs real ones)."""
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
    return ch, pb_grpc.ExternalProcessorStub(ch)


__all__ = ["DEST", "Request", "chat", "open_request", "pb", "route", "stub_for"]
