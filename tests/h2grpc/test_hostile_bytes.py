"""Hostile clients, part 2: bytes: windows, frame and header-block sizes, HPACK, messages, compression.

The hostile-client suite: one test per HTTP/2 denial-of-service class, against a real `epp serve` on each
transport (`--grpc-transport h2`, the default, and `grpcio`).

Every test runs its attack for about half a second, as a persistent attacker would (a new connection whenever the server
closes one), and asserts the four criteria (hostile.judge): the server is alive, a fresh client is routed within
2 s, its RSS grows by at most 100 MB, and its CPU falls back under half a core. Where a class has a defence of its
own (a GOAWAY with a given code, a connection closed by a timeout) that is asserted too, on the h2 transport.
grpcio is marked where its options cannot bound it (strict xfail, with the reason).
"""

from __future__ import annotations

import functools
import gzip
import time

import hpack
import orjson
from hyperframe.frame import ContinuationFrame, HeadersFrame

from epp.h2grpc.frames import hpack_int
from tests.h2grpc.attacker import (
    FD,
    GRPC_HEADERS,
    MB,
    Raw,
    frame,
    grpc_message,
    persist,
    request_bytes,
)
from tests.h2grpc.hostile import ATTACK_SECONDS, goaway_on_h2, judge, transports
from tests.support.extproc import CHAT, body_msg, headers_msg

ENHANCE_YOUR_CALM, PROTOCOL_ERROR, FRAME_SIZE_ERROR, FLOW_CONTROL_ERROR = 0xB, 0x1, 0x6, 0x3


OVERSIZED_DATA_HEADER = bytes([0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0, 1])  # DATA of 16 MiB - 1 on stream 1


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
