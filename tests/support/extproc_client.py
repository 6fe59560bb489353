"""A raw ext_proc client that plays Envoy's part for one whole request against a running Pointsman: request headers
and body (FULL_DUPLEX_STREAMED), then, if admitted, a JSON response reporting `usage`, so admission, settling and
the response path all run as behind a real Envoy. Used by the tests that drive several `epp serve` processes."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.protocol import BodyMode
from tests.support.extproc import body_msg, headers_msg, response_body_msg, response_headers_msg

FD = BodyMode.FULL_DUPLEX_STREAMED


@dataclass
class Result:
    status: int  # 200 admitted and answered, else the immediate response's status
    body: str = ""
    headers: dict[str, str] | None = None  # the request headers Pointsman set (admitted requests)


async def one_request(stub: pb_grpc.ExternalProcessorStub, body: dict, *, headers: dict[str, str] | None = None,
                      usage: tuple[int, int] | None = None) -> Result:
    """One request through Pointsman; `usage` (prompt, completion) is what the simulated engine reports."""
    call = stub.Process()
    await call.write(headers_msg(mode=FD, **(headers or {})))
    await call.write(body_msg(orjson.dumps(body), True))
    set_headers: dict[str, str] = {}
    while True:
        msg = await call.read()
        if msg is grpc.aio.EOF:
            return Result(0, "the stream ended before a decision")
        kind = msg.WhichOneof("response")
        if kind == "immediate_response":
            await call.done_writing()
            return Result(msg.immediate_response.status.code, msg.immediate_response.body.decode())
        if kind == "request_headers":
            for o in msg.request_headers.response.header_mutation.set_headers:
                set_headers[o.header.key.lower()] = o.header.raw_value.decode()
        if kind == "request_body":
            sr = msg.request_body.response.body_mutation.streamed_response
            for o in msg.request_body.response.header_mutation.set_headers:
                set_headers[o.header.key.lower()] = o.header.raw_value.decode()
            if sr.end_of_stream or not msg.request_body.response.HasField("body_mutation"):
                break
    prompt, completion = usage or (0, 0)
    await call.write(response_headers_msg())
    answer = {"id": "x", "object": "chat.completion", "choices": [],
              "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                        "total_tokens": prompt + completion}}
    await call.write(response_body_msg(orjson.dumps(answer), True))
    await call.done_writing()
    while await call.read() is not grpc.aio.EOF:
        pass
    return Result(200, headers=set_headers)
