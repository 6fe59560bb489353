"""Request body chunks read and echoed as bytes: the full-duplex echo without protobuf objects or body copies.

In FULL_DUPLEX_STREAMED every request body chunk Envoy sends comes back as the body of a `streamed_response`, and
after the decision that is all Pointsman does with it. Built with protobuf objects, a 62 KB chunk was copied about
six times (parsed into the message, read out as bytes, set into the reply, serialized, prefixed for gRPC, framed)
and paid protobuf's per-object costs twice. Here:

- `read_request_body(message)` reads a ProcessingRequest that holds a `request_body` (what Envoy sends for every
  body chunk, with an empty `metadata_context`) straight from the wire format: the envelopes' tags and lengths
  only. Its `RawBody` holds the chunk as a view of the message, not a copy. The fields the machine does not read
  on a body message are skipped, as they are when it is parsed; anything else (another kind of message, a field
  of HttpBody that Pointsman does not read, an encoding it does not expect) returns None, and the caller parses
  the message with protobuf as before.
- `RawBody.echo()` gives the replies that echo the chunk, as `RawReply`s: a small envelope computed from the
  lengths (the same bytes upb serializes: tests/test_rawbody.py checks byte equality), the chunk's view, and
  the `end_of_stream` field. A transport writes these parts as they are (`parts`, gRPC prefix included); anything
  else may call `SerializeToString()` like on a ProcessingResponse.

The wire format (protobuf encoding, field numbers from envoy/service/ext_proc/v3/external_processor.proto):
ProcessingRequest.request_body = 4, HttpBody.body = 1, HttpBody.end_of_stream = 2; ProcessingResponse.request_body
= 3, BodyResponse.response = 1, CommonResponse.body_mutation = 3, BodyMutation.streamed_response = 3,
StreamedBodyResponse.body = 1, StreamedBodyResponse.end_of_stream = 2.
"""

from __future__ import annotations

from epp.protocol.messages import CHUNK_LIMIT

_REQUEST_BODY = 0x22  # field 4, length-delimited
# ProcessingRequest's fields besides the message kinds: metadata_context 8, attributes 9, protocol_config 11
# (length-delimited), observability_mode 10 (varint). The machine reads none of them on a body message.
_SKIPPED = frozenset((8, 9, 11))
_OBSERVABILITY_MODE = 10 << 3
_BODY = 0x0A  # field 1, length-delimited
_EOS = 0x10  # field 2, varint
_EOS_TRUE = b"\x10\x01"
_NOTHING = b""


class _Malformed(Exception):
    pass


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    """A varint at `pos`: (value, the position after it)."""
    result = shift = 0
    end = len(data)
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _encode_varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class RawReply:
    """One ProcessingResponse, pre-encoded: `parts` (gRPC message prefix first) is what goes on the wire."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: tuple[bytes | memoryview, ...], size: int) -> None:
        self.parts = parts
        self.size = size  # bytes in parts, prefix included

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protobuf message's name, for the transports
        """The message without its gRPC prefix."""
        return b"".join(self.parts)[5:]


def request_echo(body: memoryview | bytes, end_of_stream: bool) -> RawReply:
    """The ProcessingResponse echoing `body` (at most CHUNK_LIMIT bytes) as a request streamed_response."""
    n = len(body)
    key = n << 1 | end_of_stream
    head = _HEADS.get(key)
    if head is None:
        head = _head(n, end_of_stream)
        if len(_HEADS) < _MAX_HEADS:
            _HEADS[key] = head
    if not n:
        return RawReply((head,), len(head))
    if end_of_stream:
        return RawReply((head, body, _EOS_TRUE), len(head) + n + 2)
    return RawReply((head, body), len(head) + n)


def _head(n: int, end_of_stream: bool) -> bytes:
    """Everything of the echo of an `n`-byte chunk that comes before the chunk's bytes (gRPC prefix included);
    with no bytes, the whole message."""
    tail = _EOS_TRUE if end_of_stream else _NOTHING
    sbr = (1 + len(_encode_varint(n)) + n if n else 0) + len(tail)  # StreamedBodyResponse
    mutation = 1 + len(_encode_varint(sbr)) + sbr  # BodyMutation
    common = 1 + len(_encode_varint(mutation)) + mutation  # CommonResponse
    response = 1 + len(_encode_varint(common)) + common  # BodyResponse
    total = 1 + len(_encode_varint(response)) + response  # ProcessingResponse
    head = b"".join((b"\x00", total.to_bytes(4, "big"), b"\x1a", _encode_varint(response), b"\x0a",
                     _encode_varint(common), b"\x1a", _encode_varint(mutation), b"\x1a", _encode_varint(sbr)))
    return head + b"\x0a" + _encode_varint(n) if n else head + tail


_HEADS: dict[int, bytes] = {}  # (chunk size << 1 | end_of_stream) -> its head: chunk sizes repeat
_MAX_HEADS = 4096


class RawBody:
    """A request body chunk read from the wire (`read_request_body`); reads like a ProcessingRequest carrying
    `request_body` and like its HttpBody (`body`, `end_of_stream`), which is all the machine reads of one."""

    __slots__ = ("body", "end_of_stream")

    def __init__(self, body: memoryview | bytes, end_of_stream: bool) -> None:
        self.body = body
        self.end_of_stream = end_of_stream

    @property
    def request_body(self) -> RawBody:
        return self

    def echo(self) -> list[RawReply]:
        """The full-duplex replies echoing this chunk: ≤ CHUNK_LIMIT bytes each, end_of_stream on the last one."""
        body, eos = self.body, self.end_of_stream
        n = len(body)
        if n <= CHUNK_LIMIT:
            return [request_echo(body, eos)]
        view = memoryview(body)
        last = (n - 1) // CHUNK_LIMIT * CHUNK_LIMIT
        return [request_echo(view[off: off + CHUNK_LIMIT], eos and off == last) for off in range(0, n, CHUNK_LIMIT)]


def read_request_body(message: bytes | bytearray | memoryview) -> RawBody | None:
    """A ProcessingRequest holding `request_body` (HttpBody with `body` and `end_of_stream`), read from the wire
    format; None for anything else (the caller parses it with protobuf). The fields the machine never reads on a
    body message are skipped (Envoy sends an empty `metadata_context` with every one)."""
    if len(message) < 2 or message[0] != _REQUEST_BODY:
        return None
    data = memoryview(message)
    end = len(data)
    pos = 0
    start = stop = -1
    try:
        while pos < end:
            tag, pos = _varint(data, pos)
            if tag & 7 == 2:  # length-delimited
                size, pos = _varint(data, pos)
                if pos + size > end:
                    return None
                if tag == _REQUEST_BODY and start < 0:
                    start, stop = pos, pos + size
                elif tag >> 3 not in _SKIPPED:
                    return None  # another kind of message, or request_body twice (protobuf merges them)
                pos += size
            elif tag == _OBSERVABILITY_MODE:
                _, pos = _varint(data, pos)
            else:
                return None
        if start < 0:
            return None
        body, eos = _http_body(data, start, stop)
    except _Malformed:
        return None
    return RawBody(body, eos)


def _http_body(data: memoryview, pos: int, end: int) -> tuple[memoryview | bytes, bool]:
    """HttpBody's `body` and `end_of_stream` (a field it has that Pointsman does not read: _Malformed)."""
    body: memoryview | bytes = _NOTHING
    eos = False
    while pos < end:
        tag = data[pos]
        if tag == _BODY:
            size, pos = _varint(data, pos + 1)
            if pos + size > end:
                raise _Malformed
            body = data[pos: pos + size]
            pos += size
        elif tag == _EOS:
            value, pos = _varint(data, pos + 1)
            eos = value != 0
        else:
            raise _Malformed
    if pos != end:
        raise _Malformed
    return body, eos
