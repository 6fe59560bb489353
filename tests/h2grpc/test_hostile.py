"""The hostile-client suite: one test per HTTP/2 denial-of-service class, against a real `epp serve` on each
transport (`--grpc-transport h2`, the default, and `grpcio`).

Every test runs its attack for about a second, as a persistent attacker would (a new connection whenever the server
closes one), and asserts the four criteria (hostile.judge): the server is alive, a fresh client is routed within
2 s, its RSS grows by at most 100 MB, and its CPU falls back under half a core. Where a class has a defence of its
own (a GOAWAY with a given code, a connection closed by a timeout) that is asserted too, on the h2 transport.
grpcio is marked where its options cannot bound it (strict xfail, with the reason).
"""

from __future__ import annotations

import functools
import gzip
import time
from collections.abc import Callable

import hpack
import orjson
import pytest
from hyperframe.frame import ContinuationFrame, HeadersFrame, PingFrame, RstStreamFrame, SettingsFrame

from epp.h2grpc.frames import hpack_int
from tests.h2grpc.hostile import (
    FD,
    GRPC_HEADERS,
    MB,
    Raw,
    Target,
    frame,
    grpc_message,
    judge,
    request_bytes,
)
from tests.support.extproc import CHAT, body_msg, headers_msg

ENHANCE_YOUR_CALM, PROTOCOL_ERROR, FRAME_SIZE_ERROR, FLOW_CONTROL_ERROR = 0xB, 0x1, 0x6, 0x3
HEADERS_MSG = grpc_message(headers_msg(mode=FD).SerializeToString())
ATTACK_SECONDS = 0.6  # how long each flood goes on
OVERSIZED_DATA_HEADER = bytes([0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0, 1])  # DATA of 16 MiB - 1 on stream 1


def transports(grpcio_fails: str | None = None, *, grpcio_may_fail: str | None = None) -> pytest.MarkDecorator:
    """Both transports. `grpcio_fails`: grpcio fails this attack every time (strict xfail); `grpcio_may_fail`: its
    figures straddle a criterion from run to run (xfail, not strict: either outcome is the expected one)."""
    grpcio: object = "grpcio"
    if grpcio_fails:
        grpcio = pytest.param("grpcio", marks=pytest.mark.xfail(reason=grpcio_fails, strict=True))
    elif grpcio_may_fail:
        grpcio = pytest.param("grpcio", marks=pytest.mark.xfail(reason=grpcio_may_fail, strict=False))
    return pytest.mark.parametrize("transport", ["h2", grpcio])


def persist(port: int, seconds: float, make: Callable[[int], Raw], step: Callable[[Raw], object],
            hold: int = 16) -> list[Raw]:
    """A persistent attacker: `step(conn)` again and again for `seconds`, on a new connection from `make` whenever
    the server closed the last one; one the server stopped reading is held open (up to `hold` of them)."""
    end = time.monotonic() + seconds
    held: list[Raw] = []
    conn: Raw | None = None
    while time.monotonic() < end:
        if conn is None or conn.closed or conn.blocked:
            if conn is not None and conn.blocked and len(held) < hold:
                held.append(conn)
            elif conn is not None:
                conn.close()
            try:
                conn = make(port)
            except OSError:
                conn = None
                time.sleep(0.01)
                continue
        step(conn)
    return held + ([conn] if conn is not None else [])


def open_streams(conn: Raw, n: int, batch: int = 500) -> list[int]:
    """`n` streams, each with the request headers message and left open (no END_STREAM)."""
    sids, frames = [], []
    for _ in range(n):
        sid = conn.next_sid()
        sids.append(sid)
        frames.append(conn.headers(sid) + Raw.data(sid, HEADERS_MSG))
        if len(frames) == batch:
            conn.send(b"".join(frames))
            frames = []
    if frames:
        conn.send(b"".join(frames))
    return sids


def goaway_on_h2(target: Target, send: Callable[[Raw], object], code: int, what: str = "") -> None:
    """On the h2 transport, what `send` does to a fresh connection is answered with GOAWAY `code`."""
    if target.transport != "h2" or target.baseline:
        return
    conn = Raw(target.port)
    try:
        send(conn)
        got = conn.goaway()
        assert got == code, f"{what}: GOAWAY {got}, expected {code}"
    finally:
        conn.close()


# ---- stream and frame floods ----------------------------------------------------------------------------------------
@transports()
def test_many_streams_on_one_connection(target):
    def attack(port: int) -> list[Raw]:
        conn = Raw(port).read_in_background()
        open_streams(conn, 20000)
        return [conn]

    judge(target, "many streams (20k on one connection)", attack).check()


@transports()
def test_settings_flood(target):
    flip = SettingsFrame(0, settings={4: 65535}).serialize() + SettingsFrame(0, settings={4: 65536}).serialize()

    def make(port: int) -> Raw:
        conn = Raw(port).read_in_background()
        open_streams(conn, 1000)
        return conn

    judge(target, "SETTINGS flood (1000 streams open)", lambda port: persist(
        port, ATTACK_SECONDS, make, lambda c: c.send(flip * 500))).check()
    goaway_on_h2(target, lambda c: c.send(flip * 1000), ENHANCE_YOUR_CALM)


@transports()
def test_window_update_flood(target):
    def make(port: int) -> Raw:
        conn = Raw(port).read_in_background()
        sids = open_streams(conn, 1000)
        conn.burst = b"".join(frame(8, 0, 0, b"\0\0\0\1") + frame(8, 0, sid, b"\0\0\0\1")  # type: ignore[attr-defined]
                              for sid in sids)
        return conn

    judge(target, "WINDOW_UPDATE flood (1000 streams open)", lambda port: persist(
        port, ATTACK_SECONDS, make, lambda c: c.send(c.burst))).check()  # type: ignore[attr-defined]
    goaway_on_h2(target, lambda c: c.send(frame(8, 0, 0, b"\0\0\0\1") * 100), ENHANCE_YOUR_CALM)


@transports()
def test_ping_flood_with_the_acks_never_read(target):
    pings = PingFrame(0, opaque_data=b"12345678").serialize() * 1000

    judge(target, "PING flood, ACKs unread", lambda port: persist(
        port, ATTACK_SECONDS, lambda p: Raw(p, rcvbuf=4096, timeout=0.2), lambda c: c.send(pings))).check()
    goaway_on_h2(target, lambda c: c.send(pings * 2), ENHANCE_YOUR_CALM)


@transports()
def test_rapid_reset(target):
    def burst(conn: Raw) -> None:
        frames = []
        for _ in range(100):
            sid = conn.next_sid()
            frames.append(conn.headers(sid) + Raw.data(sid, HEADERS_MSG) + RstStreamFrame(sid, error_code=8)
                          .serialize())
        conn.send(b"".join(frames))

    judge(target, "rapid reset", lambda port: persist(port, ATTACK_SECONDS, lambda p: Raw(p).read_in_background(),
                                                       burst)).check()
    goaway_on_h2(target, lambda c: [burst(c) for _ in range(10)], ENHANCE_YOUR_CALM)


@transports()
def test_empty_frames_flood(target):
    def make(port: int) -> Raw:
        conn = Raw(port).read_in_background()
        conn.sid = open_streams(conn, 1)[0]  # type: ignore[attr-defined]
        return conn

    judge(target, "empty DATA frames", lambda port: persist(
        port, ATTACK_SECONDS, make, lambda c: c.send(frame(0, 0, c.sid, b"") * 2000))).check()  # type: ignore[attr-defined]
    goaway_on_h2(target, lambda c: c.send(c.headers(1) + frame(0, 0, 1, b"") * 10), ENHANCE_YOUR_CALM)


@transports()
def test_made_you_reset(target):
    """Frames that make the *server* reset a stream (CVE-2025-8671), on streams with work under way."""
    variants: list[Callable[[int], bytes]] = [
        lambda sid: frame(8, 0, sid, b"\0\0\0\0"),  # WINDOW_UPDATE of 0
        lambda sid: frame(8, 0, sid, b"\x7f\xff\xff\xff") * 2,  # the stream's window overflows
        lambda sid: frame(0, 1, sid, b"") + frame(0, 0, sid, b"x"),  # DATA after END_STREAM
        lambda sid: frame(2, 0, sid, b"\0\0\0\0\0\0"),  # PRIORITY of length 6
        lambda sid: frame(2, 0, sid, sid.to_bytes(4, "big") + b"\x10"),  # PRIORITY on itself
    ]

    def burst(conn: Raw, variants: list[Callable[[int], bytes]] = variants) -> None:
        frames = []
        for i in range(100):
            sid = conn.next_sid()
            frames.append(conn.headers(sid) + Raw.data(sid, HEADERS_MSG) + variants[i % len(variants)](sid))
        conn.send(b"".join(frames))

    judge(target, "MadeYouReset", lambda port: persist(port, ATTACK_SECONDS, lambda p: Raw(p).read_in_background(),
                                                        burst)).check()
    # DATA after END_STREAM on a call already answered is a connection error (STREAM_CLOSED) of its own; the
    # others are stream errors, which the premature-reset budget counts
    resets = [v for i, v in enumerate(variants) if i != 2]
    goaway_on_h2(target, lambda c: [burst(c, resets) for _ in range(10)], ENHANCE_YOUR_CALM)


# ---- flow control and buffering ------------------------------------------------------------------------------------
@transports(grpcio_fails="grpc keeps granting the client window while the replies it cannot send queue without a "
                         "bound: +1.3 GB of RSS in 1.5 s")
def test_zero_window(target):
    """The client never lets a reply through (SETTINGS_INITIAL_WINDOW_SIZE 0) and keeps sending bodies that are
    echoed back (FULL_DUPLEX_STREAMED), within the windows the server grants."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "z" * (256 * 1024)}]})
    data = request_bytes(body)

    def step(conn: Raw) -> None:
        sid = conn.next_sid()
        conn.send(conn.headers(sid))
        if not conn.send_within(sid, data, timeout=0.3):
            conn.blocked = True  # the server stopped granting window: hold the connection

    judge(target, "zero window (replies never read)", lambda port: persist(
        port, ATTACK_SECONDS, lambda p: Raw(p, settings={4: 0}).follow_windows(own=False), step, hold=4)).check()


@transports()
def test_oversized_frames(target):
    """Frames announcing 16 MiB, on several connections, with their payload sent as fast as the server takes it."""
    chunk = b"\0" * MB

    def attack(port: int) -> list[Raw]:
        conns = [Raw(port) for _ in range(8)]
        for c in conns:
            c.send(c.headers(1) + OVERSIZED_DATA_HEADER)
        for _ in range(16):
            for c in conns:
                c.send(chunk)
        return conns

    judge(target, "oversized frames (16 MiB announced, 8 connections)", attack).check()
    goaway_on_h2(target, lambda c: c.send(c.headers(1) + OVERSIZED_DATA_HEADER), FRAME_SIZE_ERROR)


def _huffman_a(n: int) -> bytes:
    """n letters 'a' Huffman-coded by hand (5 bits each: 00011), n a multiple of 8."""
    return bytes([0b00011000, 0b11000110, 0b00110001, 0b10001100, 0b01100011]) * (n // 8)


def _header_block_frames(sid: int, block: bytes, size: int = 16384) -> bytes:
    out = HeadersFrame(sid, data=block[:size]).serialize()
    for pos in range(size, len(block), size):
        cont = ContinuationFrame(sid, data=block[pos: pos + size])
        if pos + size >= len(block):
            cont.flags.add("END_HEADERS")
        out += cont.serialize()
    return out


@transports()
def test_huge_header_block(target):
    value = _huffman_a(1_600_000)  # 1 MiB on the wire, 1.6 MB once decoded
    literal = b"\x00" + hpack_int(5, 7) + b"x-big" + hpack_int(len(value), 7, 0x80) + value

    def send(conn: Raw) -> None:
        sid = conn.next_sid()
        conn.send(_header_block_frames(sid, hpack.Encoder().encode(GRPC_HEADERS) + literal))

    judge(target, "huge header block (1 MiB, Huffman-coded)", lambda port: persist(
        port, ATTACK_SECONDS, lambda p: Raw(p), lambda c: (send(c), c.frames(0.05)))).check()
    goaway_on_h2(target, send, ENHANCE_YOUR_CALM)


@transports()
def test_continuation_flood(target):
    def step(conn: Raw) -> None:
        sid = conn.next_sid()
        conn.send(HeadersFrame(sid, data=conn.encoder.encode(GRPC_HEADERS)).serialize()
                  + ContinuationFrame(sid, data=b"\x00\x01a\x01b").serialize() * 1000)

    judge(target, "CONTINUATION flood", lambda port: persist(port, ATTACK_SECONDS, lambda p: Raw(p).read_in_background(),
                                                              step)).check()
    goaway_on_h2(target, step, ENHANCE_YOUR_CALM)


@transports()
def test_hpack_bomb(target):
    """A 4 KB entry in the dynamic table, then a block referring to it 15000 times (60 MB decoded)."""

    def send(conn: Raw) -> None:
        encoder = hpack.Encoder()
        sid = conn.next_sid()
        conn.send(HeadersFrame(sid, data=encoder.encode([*GRPC_HEADERS, ("x-bomb", "a" * 3900)]),
                               flags=["END_HEADERS"]).serialize())
        sid = conn.next_sid()
        conn.send(HeadersFrame(sid, data=b"\xbe" * 15000, flags=["END_HEADERS"]).serialize())

    judge(target, "HPACK bomb", lambda port: persist(port, ATTACK_SECONDS, lambda p: Raw(p),
                                                      lambda c: (send(c), c.frames(0.05)))).check()
    goaway_on_h2(target, send, ENHANCE_YOUR_CALM)


@transports()
def test_client_header_echo(target):
    """A long grpc-encoding with a compressed message: the reply must not repeat it (nor cost its square)."""

    @functools.cache
    def block(value: str) -> bytes:  # never indexed, no Huffman: the same bytes on any connection, built once
        return hpack.Encoder().encode([(k, v, True) for k, v in [*GRPC_HEADERS, ("grpc-encoding", value)]],
                                      huffman=False)

    def request(conn: Raw, value: str) -> int:
        sid = conn.next_sid()
        conn.send(frame(1, 0x4, sid, block(value)) + Raw.data(sid, grpc_message(b"\x01\x02", compressed=True), end=True))
        return sid

    judge(target, "client header echo (60 KB grpc-encoding)", lambda port: persist(
        port, ATTACK_SECONDS, lambda p: Raw(p).read_in_background(),
        lambda c: [request(c, "z" * 60_000) for _ in range(10)])).check()
    conn = Raw(target.port)
    try:
        sid = request(conn, "q" * 8000)
        decoder, replied = hpack.Decoder(), b""
        for ftype, _, stream, payload in conn.frames(5.0, until=lambda got: b"grpc-status" in got):
            if ftype == 1 and stream == sid:
                replied += b"".join(k + v for k, v in decoder.decode(payload, raw=True))
        assert replied, "no reply in 5 s"
        assert b"qqqq" not in replied
    finally:
        conn.close()


@transports()
def test_a_message_in_tiny_frames(target):
    """1 MiB in 16-byte DATA frames, within the windows; the stream itself must be routed too."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "t" * MB}]})
    picked: list[float] = []

    def attack(port: int) -> list[Raw]:
        conn = Raw(port).follow_windows()
        t0 = time.monotonic()
        sid = conn.next_sid()
        conn.send(conn.headers(sid))
        conn.send_within(sid, request_bytes(body), frame_size=16)
        with conn.cond:
            if conn.cond.wait_for(lambda: b"x-gateway-destination-endpoint" in conn.replies.get(sid, b""), 10):
                picked.append(time.monotonic() - t0)
        return [conn]

    judge(target, "1 MiB message in 16-byte frames", attack,
          lambda: f"routed in {picked[0]:.2f} s" if picked else "not routed").check()
    assert picked, "the attacker's own request was not routed"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@transports(grpcio_may_fail="grpc holds about 3.5 copies of a message while it is handled: +90 to +125 MB for "
                             "32 MiB, no option changes that")
def test_a_32_mib_message_in_16_kib_frames(target):
    """One 32 MiB message (the request headers message with a 32 MiB field it does not know; then the body), in
    16 KiB frames within the windows: it must be routed, well within 10 s. The size sits in a field nobody reads
    because a 32 MiB *body* costs the request parsing (orjson) about ten times its size, which is for the protocol
    layer to bound, not the transport."""
    padding = b"\xc2\x3e" + _varint(32 * MB) + b"\0" * (32 * MB)  # field 1000, length-delimited
    message = grpc_message(headers_msg(mode=FD).SerializeToString() + padding) \
        + grpc_message(body_msg(CHAT, True).SerializeToString())
    picked: list[float] = []

    def attack(port: int) -> list[Raw]:
        conn = Raw(port).follow_windows()
        t0 = time.monotonic()
        sid = conn.next_sid()
        conn.send(conn.headers(sid))
        conn.send_within(sid, message)
        with conn.cond:
            if conn.cond.wait_for(lambda: b"x-gateway-destination-endpoint" in conn.replies.get(sid, b""), 10):
                picked.append(time.monotonic() - t0)
        return [conn]

    judge(target, "32 MiB message in 16 KiB frames", attack,
          lambda: f"routed in {picked[0]:.2f} s" if picked else "not routed").check()
    assert picked, "the 32 MiB request was not routed within 10 s"


@transports()
def test_a_4_gb_length_prefix(target):
    def step(conn: Raw) -> None:
        frames = []
        for _ in range(50):
            sid = conn.next_sid()
            frames.append(conn.headers(sid) + Raw.data(sid, b"\x00\xff\xff\xff\xff" + b"\0" * 1000))
        conn.send(b"".join(frames))

    judge(target, "4 GB length prefix", lambda port: persist(port, ATTACK_SECONDS, lambda p: Raw(p).read_in_background(),
                                                              step)).check()


@functools.cache
def _gzip_bomb() -> bytes:
    return gzip.compress(b"\0" * (64 * MB), 9)  # about 64 KB, over the suite's 40 MiB message limit


@transports(grpcio_may_fail="grpc stops each inflation at the message limit but inflates several streams' messages "
                             "at once; no option bounds how many: +45 to +305 MB")
def test_gzip_bomb(target):
    bomb = grpc_message(_gzip_bomb(), compressed=True)

    def step(conn: Raw) -> None:
        sids = [conn.next_sid() for _ in range(8)]  # eight at once
        conn.send(b"".join(conn.headers(sid, fields=[*GRPC_HEADERS, ("grpc-encoding", "gzip")]) for sid in sids))
        for sid in sids:
            conn.send_within(sid, bomb, timeout=0.2)

    judge(target, "gzip bombs (64 MiB of zeros each, 8 streams at once)", lambda port: persist(
        port, ATTACK_SECONDS, lambda p: Raw(p).follow_windows(), step, hold=1)).check()


# ---- protocol misuse -----------------------------------------------------------------------------------------------
MISUSE: list[tuple[str, Callable[[Raw], bytes], int]] = [
    ("even stream id", lambda c: c.headers(2), PROTOCOL_ERROR),
    ("HEADERS on stream 0", lambda c: c.headers(0), PROTOCOL_ERROR),
    ("a stream id going down", lambda c: c.headers(5) + c.headers(3), PROTOCOL_ERROR),
    ("DATA on an idle stream", lambda c: frame(0, 0, 7, b"x"), PROTOCOL_ERROR),
    ("RST_STREAM on an idle stream", lambda c: frame(3, 0, 9, b"\0\0\0\x08"), PROTOCOL_ERROR),
    ("WINDOW_UPDATE on an idle stream", lambda c: frame(8, 0, 11, b"\0\0\0\1"), PROTOCOL_ERROR),
    ("DATA on stream 0", lambda c: frame(0, 0, 0, b"x"), PROTOCOL_ERROR),
]
MALFORMED: list[tuple[str, Callable[[Raw], bytes], int]] = [
    ("SETTINGS of 5 bytes", lambda c: frame(4, 0, 0, b"\0" * 5), FRAME_SIZE_ERROR),
    ("PING of 7 bytes", lambda c: frame(6, 0, 0, b"\0" * 7), FRAME_SIZE_ERROR),
    ("WINDOW_UPDATE of 3 bytes", lambda c: frame(8, 0, 0, b"\0" * 3), FRAME_SIZE_ERROR),
    ("RST_STREAM of 5 bytes", lambda c: c.headers(1) + frame(3, 0, 1, b"\0" * 5), FRAME_SIZE_ERROR),
    ("padding longer than the frame", lambda c: c.headers(1) + frame(0, 0x8, 1, b"\x09abc"), PROTOCOL_ERROR),
    ("SETTINGS on a stream", lambda c: frame(4, 0, 1, b""), PROTOCOL_ERROR),
    ("SETTINGS_MAX_FRAME_SIZE 100", lambda c: frame(4, 0, 0, b"\0\x05\0\0\0\x64"), PROTOCOL_ERROR),
    ("SETTINGS_INITIAL_WINDOW_SIZE 2^31", lambda c: frame(4, 0, 0, b"\0\x04\x80\0\0\0"), FLOW_CONTROL_ERROR),
    ("PUSH_PROMISE from a client", lambda c: frame(5, 0x4, 1, b"\0\0\0\2"), PROTOCOL_ERROR),
    ("a connection WINDOW_UPDATE of 0", lambda c: frame(8, 0, 0, b"\0\0\0\0"), PROTOCOL_ERROR),
    ("a HEADERS block that cannot be decoded", lambda c: frame(1, 0x4, 1, b"\xff\xff\xff\xff\xff"), 0x9),
    ("CONTINUATION without HEADERS", lambda c: frame(9, 0x4, 1, b"\x82"), PROTOCOL_ERROR),
    ("a header block interrupted", lambda c: frame(1, 0, 1, b"\x82") + frame(6, 0, 0, b"\0" * 8), PROTOCOL_ERROR),
]


def _cases_attack(cases: list[tuple[str, Callable[[Raw], bytes], int]]) -> Callable[[int], list[Raw]]:
    def attack(port: int) -> list[Raw]:
        i = [0]

        def step(conn: Raw) -> None:
            _, make, _ = cases[i[0] % len(cases)]
            i[0] += 1
            conn.send(make(conn))
            conn.frames(0.02)
            conn.close()

        return persist(port, ATTACK_SECONDS, lambda p: Raw(p), step)

    return attack


@transports()
def test_stream_id_misuse(target):
    judge(target, "stream-id misuse", _cases_attack(MISUSE)).check()
    for name, make, code in MISUSE:
        goaway_on_h2(target, lambda c, make=make: c.send(make(c)), code, name)


@transports()
def test_malformed_frames(target):
    judge(target, "malformed frames", _cases_attack(MALFORMED)).check()
    for name, make, code in MALFORMED:
        goaway_on_h2(target, lambda c, make=make: c.send(make(c)), code, name)


# ---- connections ---------------------------------------------------------------------------------------------------
def closed_within(conns: list[Raw], seconds: float, enough: int | None = None) -> int:
    """How many of `conns` the server has closed, waiting up to `seconds` for `enough` of them (default: all)."""
    end = time.monotonic() + seconds
    want = len(conns) if enough is None else enough
    while True:
        closed = sum(map(_closed_by_server, conns))
        if closed >= want or time.monotonic() > end:
            return closed
        time.sleep(0.02)


def _closed_by_server(conn: Raw) -> bool:
    conn.sock.settimeout(0.001)
    try:
        while conn.sock.recv(65536):
            pass
        return True
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


@transports()
def test_slowloris(target):
    """40 connections: half never send a byte, half dribble the preface, a byte every 50 ms (the suite's handshake
    timeout is 0.5 s: it runs out mid-preface)."""
    closed: list[int] = []

    def attack(port: int) -> list[Raw]:
        silent = [Raw(port, preface=False) for _ in range(20)]
        dribble = [Raw(port, preface=False) for _ in range(20)]
        for i in range(16):  # the attacker's pace
            for c in dribble:
                c.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[i: i + 1])
            time.sleep(0.05)
        closed.append(closed_within(silent + dribble, 2.0))
        return silent + dribble

    judge(target, "slowloris (no or a slow preface)", attack).check()
    assert closed[0] == 40, f"only {closed[0]} of 40 connections were closed by the handshake timeout"


@transports()
def test_idle_connections(target):
    closed: list[int] = []
    elapsed: list[float] = []

    def attack(port: int) -> list[Raw]:
        conns = [Raw(port) for _ in range(30)]
        t0 = time.monotonic()
        closed.append(closed_within(conns, 2.5))  # the suite's idle timeout is 0.5 s
        elapsed.append(time.monotonic() - t0)
        return conns

    judge(target, "idle connections", attack).check()
    assert closed[0] == 30, f"only {closed[0]} of 30 idle connections were closed"
    assert elapsed[0] >= 0.4, "closed before the idle timeout"


@transports(grpcio_may_fail="after the 500 connections grpc took from 0.05 s to over 2 s to route the next client "
                             "(on a loaded machine)")
def test_connection_churn(target):
    """500 connections, one after the other, each with one request, closed at once. (A count, not a time: a
    client opening connections as fast as it can is a request flood, which only capacity answers.)"""
    request = request_bytes()

    def attack(port: int) -> list[Raw]:
        for _ in range(500):
            conn = Raw(port)
            sid = conn.next_sid()
            conn.send(conn.headers(sid) + Raw.data(sid, request, end=True))
            conn.close()
        return []

    judge(target, "connection churn (500 connections)", attack).check()


@transports(grpcio_fails="grpc refuses connections beyond grpc.max_allowed_incoming_connections instead of "
                         "closing idle ones, so idle connections held by one client lock the others out")
def test_connection_cap(target):
    """200 idle connections against a cap of 64: the server must stay at the cap and still take a new client."""
    still_open: list[int] = []

    def attack(port: int) -> list[Raw]:
        conns = [Raw(port) for _ in range(200)]
        still_open.append(200 - closed_within(conns, 2.0, enough=200 - 64))
        return conns

    judge(target, "connection cap (200 idle against 64)", attack).check()
    assert still_open[0] <= 64, f"{still_open[0]} connections open, over the cap of 64"
