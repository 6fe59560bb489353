"""The h2 transport's limits, one by one, on in-process servers with tight limits over real sockets; the flags that
set them; half-closed streams."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable

import grpc
import hpack
import pytest

from epp.cmd.cli import build_parser
from epp.extproc.server import grpc_options
from epp.h2grpc import H2Server, ServerStream
from epp.h2grpc.limits import MiB, ServerLimits, from_args, grpcio_options
from tests.h2grpc.attacker import GRPC_HEADERS, PREFACE, frame, grpc_message
from tests.support.wait import until

GOAWAY, RST_STREAM, PING, SETTINGS, HEADERS, DATA, WINDOW_UPDATE = 7, 3, 6, 4, 1, 0, 8
PATH = "/test.Limits/Call"


class Frames:
    """A raw HTTP/2 client on asyncio streams: sends bytes, reads frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.seen: list[tuple[int, int, int, bytes]] = []
        self._buf = b""

    @classmethod
    async def open(cls, port: int, *, preface: bool = True, settings: bytes = b"") -> Frames:
        conn = cls(*await asyncio.open_connection("127.0.0.1", port))
        if preface:
            conn.send(PREFACE + frame(SETTINGS, 0, 0, settings))
        return conn

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def request(self, sid: int, body: bytes = b"", end: bool = False) -> None:
        self.send(frame(HEADERS, 0x4, sid, self.encoder.encode([*GRPC_HEADERS[:2], (":path", PATH),
                                                                 *GRPC_HEADERS[3:]]))
                  + (frame(DATA, 0x1 if end else 0, sid, body) if body or end else b""))

    async def until(self, pred: Callable[[list[tuple[int, int, int, bytes]]], bool], timeout: float = 3.0) -> None:
        """Read frames until `pred(seen)` holds; AssertionError when the connection ends or time runs out first."""
        end = asyncio.get_running_loop().time() + timeout
        while not pred(self.seen):
            left = end - asyncio.get_running_loop().time()
            assert left > 0, f"not reached; seen: {[(t, f, s) for t, f, s, _ in self.seen]}"
            chunk = await asyncio.wait_for(self.reader.read(65536), left)
            assert chunk, f"closed first; seen: {[(t, f, s) for t, f, s, _ in self.seen]}"
            self._buf += chunk
            while len(self._buf) >= 9:
                hi, lo, ftype, flags, sid = struct.unpack_from(">HBBBI", self._buf)
                length = hi << 8 | lo
                if len(self._buf) < 9 + length:
                    break
                self.seen.append((ftype, flags, sid, self._buf[9: 9 + length]))
                self._buf = self._buf[9 + length:]

    async def closed(self, timeout: float = 3.0) -> None:
        """Wait for the server to close the connection (reading and dropping what it sends)."""
        async with asyncio.timeout(timeout):
            while await self.reader.read(65536):
                pass

    def of(self, ftype: int, sid: int | None = None) -> list[tuple[int, int, int, bytes]]:
        return [f for f in self.seen if f[0] == ftype and (sid is None or f[2] == sid)]

    def close(self) -> None:
        self.writer.close()


def goaways(conn: Frames) -> list[tuple[int, int]]:
    return [struct.unpack(">II", p[:8]) for _, _, _, p in conn.of(GOAWAY)]


class Held:
    """A native handler that answers nothing until told to (`finish`), counting what happened to it."""

    calls: list[Held] = []

    def __init__(self, stream: ServerStream) -> None:
        self.stream = stream
        self.messages: list[bytes] = []
        self.ended = self.cancelled = False
        Held.calls.append(self)

    def on_message(self, data: bytes) -> None:
        self.messages.append(bytes(data))

    def on_end(self) -> None:
        self.ended = True

    def on_cancel(self) -> None:
        self.cancelled = True


@pytest.fixture
async def serve():
    servers: list[H2Server] = []
    Held.calls = []

    async def start(limits: ServerLimits, handler: Callable[[ServerStream], object] = Held) -> tuple[H2Server, int]:
        server = H2Server(limits=limits)
        server.add_native_method(PATH, handler)  # type: ignore[arg-type]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return server, port

    yield start
    for server in servers:
        await server.stop(0)


# ---- half-closed (remote) streams ------------------------------------------------------------------------------------
async def test_a_reply_reaches_a_client_that_half_closed_while_it_was_pending(serve):
    """The client half-closes right after its message; the answer comes later, from a timer, and still arrives."""

    class Late:
        def __init__(self, stream: ServerStream) -> None:
            self.stream = stream

        def on_message(self, data: bytes) -> None:
            pass

        def on_end(self) -> None:
            loop = asyncio.get_running_loop()
            loop.call_later(0.1, lambda: (self.stream.send(b"late reply"), self.stream.finish()))

        def on_cancel(self) -> None:
            pass

    _, port = await serve(ServerLimits(), Late)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(PATH)()
        await call.write(b"question")
        await call.done_writing()
        assert await call.read() == b"late reply"
        assert await call.code() == grpc.StatusCode.OK


# ---- streams ---------------------------------------------------------------------------------------------------------
async def test_streams_over_the_cap_are_refused_and_the_cap_is_advertised(serve):
    _, port = await serve(ServerLimits(max_concurrent_streams=2))
    conn = await Frames.open(port)
    for sid in (1, 3, 5):
        conn.request(sid)
    await conn.until(lambda seen: any(f[0] == RST_STREAM for f in seen))
    settings = dict(struct.unpack(">HI", conn.of(SETTINGS)[0][3][i: i + 6]) for i in range(0, 18, 6))
    assert settings[3] == 2  # SETTINGS_MAX_CONCURRENT_STREAMS
    assert [(s, int.from_bytes(p, "big")) for _, _, s, p in conn.of(RST_STREAM)] == [(5, 7)]  # REFUSED_STREAM
    assert len(Held.calls) == 2
    Held.calls[0].stream.finish()  # one closes: a new stream fits again
    conn.request(7)
    await until(lambda: len(Held.calls) == 3, 3.0)
    conn.close()


async def test_rapid_resets_end_the_connection_once_half_the_streams_are_premature(serve):
    _, port = await serve(ServerLimits(premature_reset_streams=20))
    conn = await Frames.open(port)
    for sid in range(1, 60, 2):
        conn.request(sid)
        conn.send(frame(RST_STREAM, 0, sid, b"\0\0\0\x08"))
    await conn.until(lambda seen: any(f[0] == GOAWAY for f in seen))
    assert goaways(conn)[0][1] == 0xB  # ENHANCE_YOUR_CALM
    assert all(h.cancelled for h in Held.calls) and 20 <= len(Held.calls) <= 22


# ---- buffers and flow control ---------------------------------------------------------------------------------------
async def test_replies_the_client_does_not_take_stop_its_window(serve):
    """The client's window for our replies is 0; every message it sends is echoed. Once more than
    max_stream_buffer_bytes wait on the stream, the server gives no more window back for it."""

    class Echo(Held):
        def on_message(self, data: bytes) -> None:
            self.stream.send(bytes(data))

    limits = ServerLimits(max_stream_buffer_bytes=256 * 1024, initial_stream_window=128 * 1024)
    server, port = await serve(limits, Echo)
    conn = await Frames.open(port, settings=struct.pack(">HI", 4, 0))  # SETTINGS_INITIAL_WINDOW_SIZE 0
    conn.request(1)
    chunk = grpc_message(b"x" * 16000)
    granted = 128 * 1024
    sent = 0
    for _ in range(200):  # as much as the windows allow
        while sent + len(chunk) <= granted:
            conn.send(frame(DATA, 0, 1, chunk))
            sent += len(chunk)
        try:
            await conn.until(lambda seen, granted=granted: sum(
                int.from_bytes(p, "big") for _, _, s, p in conn.of(WINDOW_UPDATE, 1)) + 128 * 1024 > granted,
                timeout=0.3)
        except (AssertionError, TimeoutError):
            break  # no more window
        granted = sum(int.from_bytes(p, "big") for _, _, s, p in conn.of(WINDOW_UPDATE, 1)) + 128 * 1024
    (c,) = server.connections
    assert c.out_pending == sent  # nothing could be sent back
    assert sent <= 256 * 1024 + 128 * 1024 + len(chunk)  # the bound, plus one window in flight
    conn.close()


async def test_a_peer_that_does_not_read_is_not_read(serve):
    """Replies pile up in the socket (the client reads nothing): past write_buffer_bytes the server stops reading
    the connection, and starts again once the client reads."""

    class Big(Held):
        def on_message(self, data: bytes) -> None:
            self.stream.send(b"y" * (512 * 1024))

    server, port = await serve(ServerLimits(write_buffer_bytes=64 * 1024), Big)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
    conn = Frames(reader, writer)
    conn.send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, (1 << 31) - 1))
              + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30)))
    conn.request(1)
    for _ in range(16):
        conn.send(frame(DATA, 0, 1, grpc_message(b"q")))
    await until(lambda: bool(server.connections) and next(iter(server.connections))._write_paused, 3.0)
    (c,) = server.connections
    assert c.transport is not None and not c.transport.is_reading()
    await conn.until(lambda seen: sum(len(p) for t, _, _, p in seen if t == DATA) >= 16 * 512 * 1024, timeout=10)
    await until(lambda: not c._write_paused and c.transport is not None and c.transport.is_reading(), 3.0)
    conn.close()


async def test_a_message_in_pieces_arrives_whole_and_in_order(serve):
    server, port = await serve(ServerLimits())
    messages = [b"a" * 3, b"", b"b" * 70000, b"c"]
    body = b"".join(grpc_message(m) for m in messages)
    for n, size in enumerate((1, 2, 7, 4096, 16384)):
        conn = await Frames.open(port)
        conn.request(1)
        conn.send(b"".join(frame(DATA, 0, 1, body[i: i + size]) for i in range(0, len(body), size)))
        await until(lambda n=n: len(Held.calls) > n and len(Held.calls[n].messages) == len(messages), 3.0)
        assert Held.calls[n].messages == messages
        conn.close()


async def test_grpc_message_is_cut_and_never_carries_the_clients_values(serve):
    class Chatty(Held):
        def on_message(self, data: bytes) -> None:
            self.stream.finish(13, "x" * 10_000)

    _, port = await serve(ServerLimits(), Chatty)
    conn = await Frames.open(port)
    conn.request(1, grpc_message(b"m"))
    await conn.until(lambda seen: any(f[0] == HEADERS and f[1] & 1 for f in seen))
    fields = dict(hpack.Decoder().decode(conn.of(HEADERS, 1)[-1][3], raw=True))
    assert fields[b"grpc-status"] == b"13" and len(fields[b"grpc-message"]) == 1024
    conn.close()


async def test_the_reply_header_blocks_use_no_table_whatever_the_client_allows(serve):
    """A client may allow a huge HPACK table (SETTINGS_HEADER_TABLE_SIZE); our blocks never index anything, so two
    fresh decoders read every block the same as one decoder reading them all."""

    class Quick(Held):
        def on_message(self, data: bytes) -> None:
            self.stream.send(b"r")
            self.stream.finish(0, "done")

    _, port = await serve(ServerLimits(), Quick)
    conn = await Frames.open(port, settings=struct.pack(">HI", 1, 1 << 30))
    for sid in (1, 3):
        conn.request(sid, grpc_message(b"m"))
    await conn.until(lambda seen: len([f for f in seen if f[0] == HEADERS and f[1] & 1]) == 2)
    blocks = [p for _, _, _, p in conn.of(HEADERS)]
    shared = hpack.Decoder()
    assert [shared.decode(b, raw=True) for b in blocks] == [hpack.Decoder().decode(b, raw=True) for b in blocks]
    assert shared.header_table_size == 4096 and len(shared.header_table.dynamic_entries) == 0
    conn.close()


# ---- time and connections ------------------------------------------------------------------------------------------
async def test_no_preface_in_time_closes_the_connection(serve):
    _, port = await serve(ServerLimits(handshake_timeout=0.2))
    conn = await Frames.open(port, preface=False)
    t0 = time.monotonic()
    await conn.closed()
    assert time.monotonic() - t0 >= 0.15


async def test_an_idle_connection_gets_goaway_and_is_closed(serve):
    _, port = await serve(ServerLimits(idle_timeout=0.3))
    conn = await Frames.open(port)
    conn.request(1)
    await until(lambda: len(Held.calls) == 1, 3.0)
    t0 = time.monotonic()
    Held.calls[0].stream.finish()  # idle from now on
    await conn.until(lambda seen: any(f[0] == GOAWAY for f in seen))
    assert time.monotonic() - t0 >= 0.25
    assert goaways(conn) == [(1, 0)]
    await conn.closed()


async def test_max_connection_age_drains_gracefully(serve):
    """At its age the connection announces GOAWAY (last stream 2^31-1) with a PING; the client's ACK brings the final
    GOAWAY with the last stream it opened. An open stream finishes; one that outlives the grace is cancelled."""
    _, port = await serve(ServerLimits(max_connection_age=0.3, max_connection_age_grace=0.6))
    conn = await Frames.open(port)
    conn.request(1)
    conn.request(3)
    await until(lambda: len(Held.calls) == 2, 3.0)
    await conn.until(lambda seen: any(f[0] == PING for f in seen))
    assert goaways(conn) == [((1 << 31) - 1, 0)]
    conn.request(5)  # in flight before the client saw the GOAWAY: still served
    conn.send(frame(PING, 1, 0, conn.of(PING)[0][3]))
    await conn.until(lambda seen: len(goaways(conn)) == 2)
    assert goaways(conn)[1] == (5, 0)
    await until(lambda: len(Held.calls) == 3, 3.0)
    Held.calls[0].stream.finish()
    await conn.until(lambda seen: bool(conn.of(HEADERS, 1)))
    await conn.until(lambda seen: len(conn.of(RST_STREAM)) >= 2, timeout=2)  # the grace is over: 3 and 5 cancelled
    assert {s for _, _, s, p in conn.of(RST_STREAM) if int.from_bytes(p, "big") == 8} == {3, 5}
    assert Held.calls[1].cancelled and Held.calls[2].cancelled and not Held.calls[0].cancelled
    await conn.closed()


async def test_at_the_connection_cap_the_longest_idle_connection_makes_room(serve):
    server, port = await serve(ServerLimits(max_connections=2))
    first = await Frames.open(port)
    second = await Frames.open(port)
    second.request(1)  # busy
    await until(lambda: len(server.connections) == 2 and len(Held.calls) == 1, 3.0)
    third = await Frames.open(port)
    await first.until(lambda seen: any(f[0] == GOAWAY for f in seen))  # the idle one went
    await first.closed()
    await until(lambda: len(server.connections) == 2, 3.0)
    third.request(1)  # both open now are busy: a fourth is refused
    await until(lambda: len(Held.calls) == 2, 3.0)
    fourth = await Frames.open(port)
    await fourth.closed()
    assert len(server.connections) == 2
    for c in (second, third):
        c.close()


# ---- flags -----------------------------------------------------------------------------------------------------------
def test_the_flags_make_one_limits_object_for_either_transport():
    args = build_parser().parse_args([
        "serve", "--grpc-max-concurrent-streams", "64", "--grpc-idle-timeout", "2m", "--grpc-max-connection-age", "0",
        "--grpc-max-message-bytes", str(8 * MiB), "--grpc-control-frames-per-second", "12.5"])
    limits = from_args(args)
    assert (limits.max_concurrent_streams, limits.idle_timeout, limits.max_connection_age, limits.max_message_bytes,
            limits.control_frames_per_second) == (64, 120.0, 0.0, 8 * MiB, 12.5)
    assert limits.handshake_timeout == ServerLimits().handshake_timeout  # not given: the default
    options = dict(grpc_options(False, limits))
    assert options["grpc.max_concurrent_streams"] == 64 and options["grpc.max_receive_message_length"] == 8 * MiB
    assert options["grpc.max_connection_idle_ms"] == 120_000 and "grpc.max_connection_age_ms" not in options
    assert dict(grpcio_options(ServerLimits()))["grpc.max_connection_age_grace_ms"] == 600_000


def test_a_larger_body_limit_raises_the_message_limit_and_bad_limits_are_refused():
    args = build_parser().parse_args(["serve", "--max-body-bytes", str(200 * MiB)])
    assert from_args(args).max_message_bytes == 201 * MiB
    for flags in (["--grpc-max-frame-size", "100"], ["--grpc-initial-stream-window", "10"],
                  ["--grpc-max-concurrent-streams", "0"], ["--grpc-idle-timeout=-1s"]):
        with pytest.raises(ValueError):
            from_args(build_parser().parse_args(["serve", *flags]))
