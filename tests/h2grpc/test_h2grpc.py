"""The h2 transport (epp.h2grpc) against real gRPC clients (grpcio) and raw HTTP/2 frames: its contract.

The ext_proc behaviour itself is tested on this transport by test_protocol_server.py, test_envoy_e2e.py and the
other end-to-end tests (it is the default); here: the transport's own contract.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib

import grpc
import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hyperframe.frame import GoAwayFrame

from epp.api.health import EppHealthServicer
from epp.extproc.server import build_server
from epp.h2grpc import H2Server, server_ssl_context
from epp.h2grpc.tls import self_signed_cert
from tests.extproc.test_protocol_server import FD, read_all, slow_director
from tests.support.extproc import CHAT, body_msg, headers_msg, inflight, kinds, real_director
from tests.support.h2client import RawH2, grpc_frame
from tests.support.wait import until

Msg = health_pb2.HealthCheckRequest  # a message with one string field, used by the echo service


def echo_service() -> grpc.GenericRpcHandler:
    """A grpc.aio-style servicer with every call shape, as the generated code would register it."""

    async def unary(request: Msg, context: grpc.aio.ServicerContext) -> Msg:
        if request.service == "abort":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "asked to abort: 100% sure")
        if request.service == "raise":
            raise ValueError("boom")
        if request.service == "who":
            md = dict(context.invocation_metadata())
            return Msg(service=f"{context.peer()}|{md.get('x-tag', '')}")
        return Msg(service=request.service.upper())

    async def count(requests, context) -> Msg:
        n = 0
        async for _ in requests:
            n += 1
        return Msg(service=str(n))

    async def echo(requests, context):
        async for request in requests:
            yield Msg(service=request.service)

    async def read_write(requests, context) -> None:
        while (request := await context.read()) is not grpc.aio.EOF:
            await context.write(Msg(service=request.service * 2))

    def handler(fn, kind):
        return kind(fn, request_deserializer=Msg.FromString, response_serializer=Msg.SerializeToString)

    return grpc.method_handlers_generic_handler("test.Echo", {
        "Unary": handler(unary, grpc.unary_unary_rpc_method_handler),
        "Count": handler(count, grpc.stream_unary_rpc_method_handler),
        "Echo": handler(echo, grpc.stream_stream_rpc_method_handler),
        "ReadWrite": handler(read_write, grpc.stream_stream_rpc_method_handler),
    })


def method(channel: grpc.aio.Channel, name: str, kind: str):
    make = getattr(channel, kind)
    return make(f"/test.Echo/{name}", request_serializer=Msg.SerializeToString, response_deserializer=Msg.FromString)


@pytest.fixture
async def h2():
    started: list[tuple[H2Server, grpc.aio.Channel | None]] = []

    async def start(server: H2Server | None = None, *, tls: bool = False) -> tuple[H2Server, grpc.aio.Channel, int]:
        server = server or H2Server()
        server.add_generic_rpc_handlers((echo_service(),))
        if tls:
            key, crt = self_signed_cert(["localhost"])
            port = server.add_secure_port("127.0.0.1:0", server_ssl_context(key, crt))
            creds = grpc.ssl_channel_credentials(root_certificates=crt)
            channel = grpc.aio.secure_channel(f"localhost:{port}", creds)
        else:
            port = server.add_insecure_port("127.0.0.1:0")
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        assert port
        await server.start()
        started.append((server, channel))
        return server, channel, port

    yield start
    for server, channel in started:
        if channel is not None:
            await channel.close()
        await server.stop(0)


# ---- grpc.aio servicers through the adapter -----------------------------------------------------------------------
async def test_every_call_shape_of_a_grpc_aio_servicer(h2):
    _, channel, _ = await h2()
    assert (await method(channel, "Unary", "unary_unary")(Msg(service="hi"))).service == "HI"
    assert (await method(channel, "Count", "stream_unary")(iter([Msg(), Msg(), Msg()]))).service == "3"
    call = method(channel, "Echo", "stream_stream")(iter([Msg(service="a"), Msg(service="b")]))
    assert [m.service async for m in call] == ["a", "b"]
    call = method(channel, "ReadWrite", "stream_stream")()
    await call.write(Msg(service="x"))
    assert (await call.read()).service == "xx"
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK


async def test_abort_and_exceptions_become_statuses(h2):
    _, channel, _ = await h2()
    unary = method(channel, "Unary", "unary_unary")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await unary(Msg(service="abort"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "asked to abort: 100% sure"  # percent-encoded on the wire, decoded by grpc
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await unary(Msg(service="raise"))
    assert err.value.code() == grpc.StatusCode.UNKNOWN and "boom" in err.value.details()
    assert (await unary(Msg(service="still fine"))).service == "STILL FINE"


async def test_peer_and_metadata_reach_the_servicer(h2):
    _, channel, _ = await h2()
    reply = await method(channel, "Unary", "unary_unary")(Msg(service="who"), metadata=(("x-tag", "t1"),))
    peer, tag = reply.service.split("|")
    assert peer.startswith("ipv4:127.0.0.1:") and tag == "t1"


async def test_unknown_method_is_unimplemented(h2):
    _, channel, _ = await h2()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await method(channel, "Nope", "unary_unary")(Msg())
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_health_check_and_watch(h2):
    server = H2Server()
    ready = [False]
    servicer = EppHealthServicer(lambda: ready[0], watch_poll_s=0.02, leader_election=True)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    _, channel, _ = await h2(server)
    stub = health_pb2_grpc.HealthStub(channel)
    assert (await stub.Check(health_pb2.HealthCheckRequest(service="liveness"))).status == servicer.status_for("liveness")
    # GIE's elected EPP answers an unknown name SERVICE_UNKNOWN (a status, not an error)
    unknown = await stub.Check(health_pb2.HealthCheckRequest(service="nope"))
    assert unknown.status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="readiness"))
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
    ready[0] = True
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


async def test_tls_with_a_grpc_client(h2):
    _, channel, _ = await h2(tls=True)
    assert (await method(channel, "Unary", "unary_unary")(Msg(service="tls"))).service == "TLS"


# ---- limits, deadlines, flow control ------------------------------------------------------------------------------
async def test_a_message_over_the_limit_is_resource_exhausted(h2):
    _, channel, _ = await h2(H2Server(max_message_bytes=1000))
    unary = method(channel, "Unary", "unary_unary")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await unary(Msg(service="x" * 2000))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await unary(Msg(service="small"))).service == "SMALL"  # the connection is fine


async def test_messages_of_every_size_are_assembled_across_frames(h2):
    """Messages begin and end anywhere in the DATA frames (which are views of the reads), of one frame or many:
    each arrives intact and in order, the stream's next message too."""
    _, channel, _ = await h2(H2Server(max_message_bytes=8 << 20))
    mib = 1 << 20  # text bytes: a tag and 3 length bytes make the message 1 MiB for mib - 4
    sizes = [0, 1, 4, 5, 6, 16_379, 16_384, 16_389, mib - 6, mib - 5, mib - 4, mib - 3, 3 << 20, 7]
    texts = [chr(65 + i % 26) * n for i, n in enumerate(sizes)]
    call = method(channel, "Echo", "stream_stream")(iter([Msg(service=t) for t in texts]))
    assert [m.service async for m in call] == texts


async def test_connections_reading_at_once_share_the_read_buffer_safely(h2):
    """Every connection reads into the server's one buffer: messages split over many reads, on several
    connections at once, still arrive intact (nothing keeps a view of a read past it)."""
    server, _, port = await h2(H2Server(max_message_bytes=8 << 20))
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(3)]
    try:
        async def stream(i: int, channel: grpc.aio.Channel) -> list[str]:
            texts = [chr(97 + (i * 7 + j) % 26) * (300_000 + 4099 * j) for j in range(4)]
            call = method(channel, "Echo", "stream_stream")(iter([Msg(service=t) for t in texts]))
            got = [m.service async for m in call]
            assert got == texts
            return got

        results = await asyncio.gather(*(stream(i, c) for i, c in enumerate(channels)))
        assert len(results) == 3
    finally:
        for c in channels:
            await c.close()


@pytest.mark.parametrize("early", [False, True])
async def test_big_bodies_flow_both_ways_past_the_windows(early):
    """An 6 MB chat body in 64 KiB messages: more than the 4 MiB windows in and the client's window out; the
    streamed echo comes back complete and in order. Decided at the end, the body is held and echoed after the last
    message (the client may write it all before it reads); decided early, each chunk is echoed as it arrives and
    the transport's flow control holds the client back while it does not read, so it reads as it writes (as Envoy
    does)."""
    from epp.request.settings import EarlySettings

    director = real_director().replace(early=EarlySettings(decisions=early))
    server, _ = build_server(director)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "y" * (6 << 20)}]})
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
                ("grpc.max_receive_message_length", -1)]) as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()

            async def write() -> None:
                await call.write(headers_msg(mode=FD))
                step = 64 * 1024
                for off in range(0, len(body), step):
                    await call.write(body_msg(body[off: off + step], off + step >= len(body)))

            async def read() -> tuple[list[pb.ProcessingResponse], bytes]:
                replies = [await call.read()]
                echoed = b""
                while not echoed or len(echoed) < len(body):
                    r = await call.read()
                    echoed += r.request_body.response.body_mutation.streamed_response.body
                return replies, echoed

            if early:
                _, (replies, echoed) = await asyncio.gather(write(), read())
            else:
                await write()
                replies, echoed = await read()
            assert kinds(replies) == ["request_headers"] and echoed == body
            await call.done_writing()
            assert await read_all(call) == []
        await until(lambda: inflight(director) == 0, 5.0)
    finally:
        await server.stop(0)


async def test_a_deadline_cancels_a_pending_decision():
    director = slow_director()
    gate = director.gate
    server, _ = build_server(director)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process(timeout=0.3)
            await call.write(headers_msg(mode=FD))
            await call.write(body_msg(CHAT, True))
            assert await call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await until(lambda: gate.cancelled == 1 and gate.closes == 1, 5.0)
        assert inflight(director) == 0
    finally:
        await server.stop(0)


async def test_stop_with_grace_lets_an_open_call_finish_and_refuses_new_ones():
    director = slow_director()
    gate = director.gate
    server, _ = build_server(director)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        call = stub.Process()
        await call.write(headers_msg(mode=FD))
        await call.write(body_msg(CHAT, True))
        await until(lambda: gate.started == 1, 5.0)
        stopping = asyncio.ensure_future(server.stop(5))
        await asyncio.sleep(0.1)
        gate.event.set()
        assert kinds([await call.read(), await call.read()]) == ["request_headers", "request_body"]
        await call.done_writing()
        assert await read_all(call) == []
        await stopping
        late = stub.Process()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await late.write(headers_msg(mode=FD))
            await late.read()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert gate.closes == 1 and inflight(director) == 0


# ---- raw HTTP/2 -----------------------------------------------------------------------------------------------------
async def test_requests_that_are_not_grpc(h2):
    _, _, port = await h2()
    client = await RawH2().connect(port)
    try:
        get = client.request("/test.Echo/Unary", method="GET", end=True)
        text = client.request("/test.Echo/Unary", content_type="text/plain", end=True)
        await client.until(lambda _: client.ended(get) and client.ended(text))
        assert client.headers_of(get)[0][":status"] == "405"
        assert client.headers_of(text)[0][":status"] == "415"
    finally:
        await client.close()


@pytest.mark.parametrize("case,code", [("compressed", 12), ("truncated", 13), ("bad-timeout", 13)])
async def test_broken_grpc_framing_gets_a_status(h2, case, code):
    _, _, port = await h2()
    client = await RawH2().connect(port)
    try:
        msg = Msg(service="x").SerializeToString()
        if case == "bad-timeout":
            sid = client.request("/test.Echo/Unary", extra=[("grpc-timeout", "soon")])
            client.data(sid, grpc_frame(msg), end=True)
        else:
            sid = client.request("/test.Echo/Unary")
            data = grpc_frame(msg, compressed=True) if case == "compressed" else grpc_frame(msg)[:-1]
            client.data(sid, data, end=True)
        await client.until(lambda _: client.ended(sid))
        assert client.headers_of(sid)[-1]["grpc-status"] == str(code)
    finally:
        await client.close()


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
async def test_compressed_requests_are_inflated(h2, compression):
    """A grpc client may compress its messages (grpc-encoding gzip or deflate); the replies stay uncompressed."""
    _, channel, _ = await h2()
    unary = method(channel, "Unary", "unary_unary")
    reply = await unary(Msg(service="squeezed " * 200), compression=compression)
    assert reply.service == "SQUEEZED " * 200
    call = method(channel, "Echo", "stream_stream")(iter([Msg(service="a" * 500), Msg(service="b")]),
                                                   compression=compression)
    assert [m.service async for m in call] == ["a" * 500, "b"]


@pytest.mark.parametrize("encoding,payload,code", [
    ("br", zlib.compress(b"x"), 12),  # an encoding the server does not speak: UNIMPLEMENTED
    ("gzip", b"not gzip at all", 13),  # a broken stream: INTERNAL
    ("gzip", gzip.compress(b"\x00" * 300_000), 8),  # over the limit once inflated: RESOURCE_EXHAUSTED
])
async def test_bad_compressed_requests_get_a_status(h2, encoding, payload, code):
    _, _, port = await h2(H2Server(max_message_bytes=200_000))
    client = await RawH2().connect(port)
    try:
        sid = client.request("/test.Echo/Unary", extra=[("grpc-encoding", encoding)])
        client.data(sid, grpc_frame(payload, compressed=True), end=True)
        await client.until(lambda _: client.ended(sid))
        assert client.headers_of(sid)[-1]["grpc-status"] == str(code)
    finally:
        await client.close()


async def test_a_client_goaway_lets_its_open_streams_finish(h2):
    server = H2Server()
    ready = [False]
    health_pb2_grpc.add_HealthServicer_to_server(EppHealthServicer(lambda: ready[0], watch_poll_s=0.02), server)
    _, _, port = await h2(server)
    client = await RawH2().connect(port)
    try:
        sid = client.request("/grpc.health.v1.Health/Watch")
        client.data(sid, grpc_frame(health_pb2.HealthCheckRequest(service="readiness").SerializeToString()), end=True)
        await client.until(lambda _: len(client.body_of(sid)) > 0)
        assert client.writer is not None
        client.writer.write(GoAwayFrame(0, last_stream_id=0, error_code=0).serialize())  # bypasses client h2 state
        ready[0] = True
        first = len(client.body_of(sid))
        await client.until(lambda _: len(client.body_of(sid)) > first)  # still served after the GOAWAY
        reply = health_pb2.HealthCheckResponse.FromString(client.body_of(sid)[first + 5:])
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await client.close()


async def test_a_failing_native_handler_ends_its_call_not_the_connection(h2):
    class Broken:
        def __init__(self, stream):
            self.stream = stream

        def on_message(self, data):
            raise RuntimeError("handler bug")

        def on_end(self):
            self.stream.finish()

        def on_cancel(self):
            pass

    server = H2Server()
    server.add_native_method("/test.Broken/Call", Broken)
    _, channel, _ = await h2(server)
    broken = channel.unary_unary("/test.Broken/Call", request_serializer=Msg.SerializeToString,
                                 response_deserializer=Msg.FromString)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broken(Msg(service="x"))
    assert err.value.code() == grpc.StatusCode.INTERNAL and "handler bug" in err.value.details()
    assert (await method(channel, "Unary", "unary_unary")(Msg(service="ok"))).service == "OK"
