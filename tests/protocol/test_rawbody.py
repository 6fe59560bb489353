"""The full-duplex echo built from bytes (epp/protocol/rawbody.py) is what upb would read and write."""

from __future__ import annotations

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.protocol import (
    CHUNK_LIMIT,
    BodyMode,
    Outcome,
    RawBody,
    RawReply,
    RequestMachine,
    read_request_body,
    streamed_chunks,
)

# around every varint length boundary of each nested envelope, plus the sizes Envoy sends
SIZES = sorted({0, 1, 2, 100, 119, 120, 121, 122, 123, 124, 125, 126, 127, 128, 129, 130, 16370, 16376, 16377, 16378,
                16379, 16380, 16381, 16382, 16383, 16384, 16385, 16386, 16390, 61_990, CHUNK_LIMIT - 1, CHUNK_LIMIT})


def _upb_echo(body: bytes, eos: bool) -> bytes:
    resp = pb.ProcessingResponse()
    sbr = resp.request_body.response.body_mutation.streamed_response
    sbr.body = body
    if eos:
        sbr.end_of_stream = True
    return resp.SerializeToString()


@pytest.mark.parametrize("eos", [False, True])
@pytest.mark.parametrize("size", SIZES)
def test_echo_is_byte_equal_to_upb(size: int, eos: bool) -> None:
    body = bytes(range(256)) * (size // 256 + 1)
    body = body[:size]
    [reply] = RawBody(memoryview(body), eos).echo()
    wire = b"".join(reply.parts)
    expected = _upb_echo(body, eos)
    assert wire[5:] == expected
    assert wire[:5] == b"\x00" + len(expected).to_bytes(4, "big")
    assert reply.size == len(wire)
    assert reply.SerializeToString() == expected


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16383, 16384, CHUNK_LIMIT, CHUNK_LIMIT + 1, 2 * CHUNK_LIMIT,
                                  256 * 1024 + 7])
@pytest.mark.parametrize("eos", [False, True])
def test_read_then_echo_matches_the_protobuf_path(size: int, eos: bool) -> None:
    body = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    req = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=eos)).SerializeToString()
    raw = read_request_body(req)
    assert raw is not None
    assert bytes(raw.body) == body and raw.end_of_stream is eos
    assert raw.request_body is raw
    echoed = raw.echo()
    expected = [r.SerializeToString() for r in streamed_chunks(body, eos, request=True)]
    assert [r.SerializeToString() for r in echoed] == expected
    assert all(isinstance(r, RawReply) for r in echoed)


def test_the_body_is_a_view_not_a_copy() -> None:
    req = bytearray(pb.ProcessingRequest(request_body=pb.HttpBody(body=b"x" * 70_000)).SerializeToString())
    raw = read_request_body(req)
    assert raw is not None and isinstance(raw.body, memoryview) and raw.body.obj is req
    assert all(isinstance(p, (bytes, memoryview)) for r in raw.echo() for p in r.parts)
    assert sum(len(p) for r in raw.echo() for p in r.parts if isinstance(p, memoryview)) == 70_000


@pytest.mark.parametrize("req", [
    pb.ProcessingRequest(request_body=pb.HttpBody(body=b"abc"), observability_mode=True),
    pb.ProcessingRequest(request_body=pb.HttpBody(body=b"abc", end_of_stream=True), metadata_context={}),
    pb.ProcessingRequest(request_body=pb.HttpBody(end_of_stream=True),
                         metadata_context={"filter_metadata": {"a": {"fields": {"k": {"string_value": "v"}}}}}),
    pb.ProcessingRequest(request_body=pb.HttpBody(body=b"x" * 200), attributes={"a": {}},
                         protocol_config=pb.ProtocolConfiguration(request_body_mode=4)),
], ids=["observability-mode", "empty-metadata", "metadata", "attributes-and-config"])
def test_fields_the_machine_ignores_on_a_body_are_skipped(req: pb.ProcessingRequest) -> None:
    wire = req.SerializeToString()
    if not req.HasField("metadata_context"):
        wire += b"B\x00"  # as Envoy sends it: an empty metadata_context on every message
    raw = read_request_body(wire)
    assert raw is not None
    parsed = pb.ProcessingRequest.FromString(wire).request_body
    assert bytes(raw.body) == parsed.body and raw.end_of_stream is parsed.end_of_stream


def test_envoys_last_body_message_is_read() -> None:
    raw = read_request_body(b'"\x02\x10\x01B\x00')  # end_of_stream, no bytes, an empty metadata_context
    assert raw is not None and bytes(raw.body) == b"" and raw.end_of_stream is True


@pytest.mark.parametrize("wire", [
    pb.ProcessingRequest(request_headers=pb.HttpHeaders(end_of_stream=True)).SerializeToString(),
    pb.ProcessingRequest(response_body=pb.HttpBody(body=b"abc")).SerializeToString(),
    pb.ProcessingRequest(request_body=pb.HttpBody(body=b"abc", end_of_stream_without_message=True)).SerializeToString(),
    # a oneof's last member wins: this is a request_headers message
    pb.ProcessingRequest(request_body=pb.HttpBody(body=b"abc")).SerializeToString()
    + pb.ProcessingRequest(request_headers=pb.HttpHeaders()).SerializeToString(),
    # request_body twice: protobuf merges the two
    pb.ProcessingRequest(request_body=pb.HttpBody(body=b"abc")).SerializeToString()
    + pb.ProcessingRequest(request_body=pb.HttpBody(end_of_stream=True)).SerializeToString(),
    b"\x22\x00\x9a\x01\x00",  # an unknown field (19)
], ids=["headers", "response-body", "unread-body-field", "then-headers", "body-twice", "unknown-field"])
def test_anything_but_a_plain_body_goes_to_protobuf(wire: bytes) -> None:
    assert read_request_body(wire) is None


@pytest.mark.parametrize("wire", [b"", b"\x22", b"\x22\x05\x0a\x03ab", b"\x22\x03\x0a\x05abc", b"\x22\x80",
                                  b"\x22\x02\x10", b"\x22\x0b" + b"\x10" + b"\xff" * 10, b"\x22\x02\x0a\x80",
                                  b"\x22\x00\x42", b"\x22\x00\x42\x05ab", b"\x22\x00\x50"])
def test_malformed_or_cut_messages_go_to_protobuf(wire: bytes) -> None:
    assert read_request_body(wire) is None


def test_fields_in_any_order_and_repeated_read_as_protobuf_does() -> None:
    inner = b"\x10\x01" + b"\x0a\x02ab" + b"\x0a\x03xyz" + b"\x10\x00" + b"\x10\x02"
    wire = b"\x22" + bytes((len(inner),)) + inner
    raw = read_request_body(wire)
    upb = pb.ProcessingRequest.FromString(wire)
    assert raw is not None
    assert bytes(raw.body) == upb.request_body.body and raw.end_of_stream == upb.request_body.end_of_stream


class _Reader:
    """An exchange that reads the body as it streams and can decide after `early_after` chunks (never: -1)."""

    def __init__(self, early_after: int) -> None:
        self.early_after = early_after
        self.seen: list[bytes] = []
        self.kinds: list[type] = []

    def request_chunk(self, headers: object, data: bytes | memoryview, end_of_stream: bool) -> bool:
        self.seen.append(bytes(data))
        self.kinds.append(type(data))
        return len(self.seen) == self.early_after


CHUNKS = [(b"a" * 100, False), (b"b" * 70_000, False), (b"", False), (b"c" * 5, False), (b"d" * 3, True)]
ROUTE = Outcome(set_headers=[("x-gateway-destination-endpoint", "10.0.0.1:8000")])


def _run(early_after: int, raw: bool) -> tuple[list[bytes], list[bytes], list[type]]:
    reader = _Reader(early_after)
    m = RequestMachine(reader, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)  # type: ignore[arg-type]
    out = m.feed(pb.ProcessingRequest(request_headers=pb.HttpHeaders()))
    for body, eos in CHUNKS:
        wire = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=eos)).SerializeToString()
        if raw:
            chunk = read_request_body(wire)
            assert chunk is not None
            out += m.feed_body(chunk)
        else:
            out += m.feed(pb.ProcessingRequest.FromString(wire))
        if m.decision is not None:
            out += m.resolve(ROUTE)
    assert m.finished is False and m.decision is None
    return [r.SerializeToString() for r in out], reader.seen, reader.kinds


@pytest.mark.parametrize("early_after", [-1, 1, 2], ids=["at-the-end", "after-the-first-chunk", "after-two"])
def test_the_machine_answers_raw_chunks_as_it_answers_parsed_ones(early_after: int) -> None:
    parsed, parsed_seen, _ = _run(early_after, raw=False)
    raw, raw_seen, raw_kinds = _run(early_after, raw=True)
    assert raw == parsed
    assert raw_seen == parsed_seen
    assert memoryview in raw_kinds  # a chunk read from the wire reaches the exchange as a view, not a copy
    echoed = b"".join(pb.ProcessingResponse.FromString(r).request_body.response.body_mutation.streamed_response.body
                      for r in raw)
    assert echoed == b"".join(body for body, _ in CHUNKS)  # every byte comes back, in order


def test_a_buffered_body_read_raw_is_decided_on_the_same_bytes() -> None:
    bodies = []
    for raw in (False, True):
        m = RequestMachine(object(), request_body_mode=BodyMode.BUFFERED)  # type: ignore[arg-type]
        m.feed(pb.ProcessingRequest(request_headers=pb.HttpHeaders()))
        wire = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}" * 40_000, end_of_stream=True))
        chunk = read_request_body(wire.SerializeToString())
        assert chunk is not None
        m.feed_body(chunk) if raw else m.feed(wire)
        assert m.decision is not None
        bodies.append(m.decision.body)
    assert bodies[0] == bodies[1]
    assert type(bodies[1]) is memoryview  # the message's view: the decision parses it without a copy first
