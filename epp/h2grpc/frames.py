"""HTTP/2 on the wire (RFC 9113), the server's side of it: frame types, flags, codes, and the frames we send.

Header blocks we send never use HPACK's dynamic table or Huffman coding (RFC 7541 §6.2.2, "literal without
indexing"): our response headers and trailers are a handful of short fields, most of them the same on every
stream, so their blocks are built once; nothing a client sends makes encoding them cost more than their length.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# error codes
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB
# settings
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

GOAWAY_PING = b"goaway\x00\x00"  # the PING behind our announcing GOAWAY: its ACK says the client saw it
MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535
LAST_STREAM = (1 << 31) - 1

# length (24 bits, as 16 + 8), type, flags, stream id (the reserved bit is masked off by readers)
HEADER = struct.Struct(">HBBBI")
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_GOAWAY = struct.Struct(">II")
_RST = struct.Struct(">I")


class H2Error(Exception):
    """A connection error (RFC 9113 §5.4.1): the connection ends with GOAWAY carrying `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def header(length: int, ftype: int, flags: int, sid: int) -> bytes:
    return HEADER.pack(length >> 8, length & 0xFF, ftype, flags, sid)


def settings(values: list[tuple[int, int]]) -> bytes:
    payload = b"".join(_SETTING.pack(k, v) for k, v in values)
    return header(len(payload), SETTINGS, 0, 0) + payload


SETTINGS_ACK = header(0, SETTINGS, ACK, 0)


def window_update(sid: int, increment: int) -> bytes:
    return header(4, WINDOW_UPDATE, 0, sid) + _U32.pack(increment)


def rst_stream(sid: int, code: int) -> bytes:
    return header(4, RST_STREAM, 0, sid) + _RST.pack(code)


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return header(8 + len(debug), GOAWAY, 0, 0) + _GOAWAY.pack(last_stream, code) + debug


def ping(payload: bytes, ack: bool) -> bytes:
    return header(8, PING, ACK if ack else 0, 0) + payload


def headers(sid: int, block: bytes, end_stream: bool, max_frame: int) -> list[bytes]:
    """HEADERS (and CONTINUATION when the block is longer than the peer's frame size)."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return [header(len(block), HEADERS, flags | END_HEADERS, sid), block]
    out = [header(max_frame, HEADERS, flags, sid), block[:max_frame]]
    pos = max_frame
    while pos < len(block):
        chunk = block[pos: pos + max_frame]
        pos += len(chunk)
        out += [header(len(chunk), CONTINUATION, END_HEADERS if pos >= len(block) else 0, sid), chunk]
    return out


# ---- HPACK, sending side: literals only ----------------------------------------------------------------------------
def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 §5.1 integer with an N-bit prefix; `first` holds the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A field as a literal without indexing, new name, no Huffman coding (RFC 7541 §6.2.2)."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def encode_fields(fields: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(literal(k, v) for k, v in fields)


# ":status: 200" is entry 8 of the static table; the rest are literals.
RESPONSE_HEADERS = b"\x88" + encode_fields([(b"content-type", b"application/grpc"),
                                             (b"grpc-accept-encoding", b"identity,deflate,gzip")])
_STATUS = [literal(b"grpc-status", b"%d" % code) for code in range(17)]


def status_literal(code: int) -> bytes:
    return _STATUS[code] if 0 <= code < len(_STATUS) else literal(b"grpc-status", b"%d" % code)


def status_only(code: int) -> bytes:
    """A response with no headers of its own: `:status` is the block of a trailers-only response."""
    return literal(b":status", b"%d" % code)
