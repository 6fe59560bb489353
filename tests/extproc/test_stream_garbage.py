"""A finished ext_proc stream on the h2 transport leaves nothing for the cyclic GC: refcounting frees its session,
exchange and request as soon as the stream ends. Objects caught in a reference cycle survive until a collection, and
with thousands of long-lived streams they reach the oldest generation, whose collections walk every live stream
(CPU per request that grows with the streams held open: bench/bench_streams.py)."""

from __future__ import annotations

import asyncio
import gc

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.cmd.app import App
from epp.extproc.h2 import ExtProcCall
from epp.extproc.session import StreamSession
from epp.protocol import BodyMode
from epp.request.exchange import RequestExchange
from tests.support.envoy import free_port
from tests.support.extproc import (
    CHAT,
    body_msg,
    headers_msg,
    inflight,
    kinds,
    response_body_msg,
    response_headers_msg,
)
from tests.support.stack import serve_args
from tests.support.wait import until

FD = BodyMode.FULL_DUPLEX_STREAMED
PER_STREAM = (ExtProcCall, StreamSession, RequestExchange)


def alive() -> dict[str, int]:
    counts = {t.__name__: 0 for t in PER_STREAM}
    for o in gc.get_objects():
        if isinstance(o, PER_STREAM):
            counts[type(o).__name__] += 1
    return counts


async def test_finished_and_cancelled_streams_are_freed_without_the_cyclic_gc(tmp_path):
    """`epp serve`'s application (its request observers: passive health, metrics, the decision record) on the
    default h2 transport."""
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints: [{address: 127.0.0.1, port: 1}, {address: 127.0.0.1, port: 2}]\n")
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps)))
    await app.start()
    director = app.current()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.port}")
    stub = pb_grpc.ExternalProcessorStub(channel)

    async def routed(end: str) -> None:
        call = stub.Process()
        await call.write(headers_msg(mode=FD))
        await call.write(body_msg(CHAT, True))
        assert kinds([await call.read(), await call.read()]) == ["request_headers", "request_body"]
        if end == "cancel":  # the client resets the stream (the server sees it lost)
            call.cancel()
            return
        if end == "response":  # Envoy's full response phases: the follows (passive health, metrics) see it
            await call.write(response_headers_msg())
            await call.write(response_body_msg(b'{"usage": {"completion_tokens": 3}}', True))
            assert kinds([await call.read(), await call.read()]) == ["response_headers", "response_body"]
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF

    try:
        await routed("half-close")  # warm up: whatever is created once per process is created now
        await until(lambda: inflight(director) == 0, 5.0, "the warm-up stream ended")
        gc.collect()
        gc.disable()
        try:
            await asyncio.gather(*(routed(("cancel", "response", "half-close")[i % 3]) for i in range(21)))
            await until(lambda: inflight(director) == 0, 5.0, "every stream ended")
            # Envoy-like streams, all over: nothing of theirs may be left waiting for a collection.
            await until(lambda: not any(alive().values()), 5.0, f"streams' objects left for the cyclic GC: {alive()}")
        finally:
            gc.enable()
    finally:
        await channel.close()
        await app.stop(0)
