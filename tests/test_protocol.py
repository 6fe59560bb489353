"""The sans-IO protocol machine, driven through message sequences for every body mode."""

from __future__ import annotations

import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.protocol import CHUNK_LIMIT, BodyMode, Outcome, RequestMachine

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


class Recorder:
    """Records what the machine asks; routes everything to one fixed endpoint."""

    def __init__(self, outcome: Outcome | None = None) -> None:
        self.decisions: list[tuple[dict, bytes, dict]] = []
        self.outcome = outcome or Outcome(
            set_headers=[("x-gateway-destination-endpoint", "10.0.0.1:8000")],
            remove_headers=["x-gateway-destination-endpoint-served"],
            metadata={"envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000"}},
        )
        self.response_chunks: list[tuple[bytes, bool]] = []

    def decide(self, headers, body, metadata):
        self.decisions.append((dict(headers), body, metadata))
        return self.outcome

    def response_headers(self, headers, metadata):
        return [("x-served", "yes")]

    def response_body(self, chunk, end_of_stream):
        self.response_chunks.append((chunk, end_of_stream))
        return chunk

    def close(self):
        pass


def headers_msg(eos: bool = False, *, use_value: bool = False, mode: BodyMode | None = None, **extra) -> pb.ProcessingRequest:
    hdrs = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json", **extra}
    hm = pb.HttpHeaders(end_of_stream=eos)
    for k, v in hdrs.items():
        if use_value:
            hm.headers.headers.add(key=k, value=v)
        else:
            hm.headers.headers.add(key=k, raw_value=v.encode())
    req = pb.ProcessingRequest(request_headers=hm)
    if mode is not None:
        req.protocol_config.request_body_mode = int(mode)
        req.protocol_config.response_body_mode = int(mode)
    return req


def body_msg(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


def kinds(replies: list[pb.ProcessingResponse]) -> list[str]:
    return [r.WhichOneof("response") for r in replies]


def set_headers(resp: pb.ProcessingResponse, phase: str) -> dict[str, bytes]:
    common = getattr(resp, phase).response
    for opt in common.header_mutation.set_headers:
        assert opt.header.value == "", "only raw_value may be set"
    return {o.header.key: o.header.raw_value for o in common.header_mutation.set_headers}


def test_full_duplex_defers_headers_and_echoes_body_in_order():
    rec = Recorder()
    m = RequestMachine(rec)
    assert m.feed(headers_msg(mode=BodyMode.FULL_DUPLEX_STREAMED)) == []
    half = len(CHAT) // 2
    assert m.feed(body_msg(CHAT[:half], False)) == []
    out = m.feed(body_msg(CHAT[half:], True))
    assert kinds(out) == ["request_headers", "request_body"]
    hdrs = set_headers(out[0], "request_headers")
    assert hdrs["x-gateway-destination-endpoint"] == b"10.0.0.1:8000"
    assert out[0].request_headers.response.clear_route_cache
    assert out[0].request_headers.response.header_mutation.remove_headers == ["x-gateway-destination-endpoint-served"]
    lb = out[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == "10.0.0.1:8000"
    sr = out[1].request_body.response.body_mutation.streamed_response
    assert sr.body == CHAT and sr.end_of_stream
    assert rec.decisions[0][1] == CHAT
    assert rec.decisions[0][0][":path"] == "/v1/chat/completions"


def test_full_duplex_large_body_is_rechunked_with_eos_on_last_only():
    body = b"x" * (CHUNK_LIMIT * 3 + 17)
    m = RequestMachine(Recorder())
    m.feed(headers_msg())
    out = []
    for i in range(0, len(body), 10_000):
        out += m.feed(body_msg(body[i : i + 10_000], i + 10_000 >= len(body)))
    assert kinds(out)[0] == "request_headers"
    chunks = [r.request_body.response.body_mutation.streamed_response for r in out[1:]]
    assert all(len(c.body) <= CHUNK_LIMIT for c in chunks)
    assert b"".join(c.body for c in chunks) == body
    assert [c.end_of_stream for c in chunks] == [False] * (len(chunks) - 1) + [True]


def test_full_duplex_trailers_end_body_and_get_a_reply():
    m = RequestMachine(Recorder())
    m.feed(headers_msg())
    assert m.feed(body_msg(CHAT, False)) == []
    out = m.feed(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    assert kinds(out) == ["request_headers", "request_body", "request_trailers"]
    assert not out[1].request_body.response.body_mutation.streamed_response.end_of_stream


def test_headers_only_request_is_decided_at_once():
    rec = Recorder()
    m = RequestMachine(rec)
    out = m.feed(headers_msg(eos=True, **{":method": "GET"}))
    assert kinds(out) == ["request_headers"]
    assert set_headers(out[0], "request_headers")["x-gateway-destination-endpoint"] == b"10.0.0.1:8000"
    assert rec.decisions[0][1] == b""


def test_duplicate_end_of_stream_is_tolerated():
    m = RequestMachine(Recorder())
    m.feed(headers_msg())
    first = m.feed(body_msg(CHAT, True))
    assert len(first) == 2
    assert m.feed(body_msg(b"", True)) == []
    assert m.feed(body_msg(b"", True)) == []


def test_raw_value_falls_back_to_value():
    rec = Recorder()
    m = RequestMachine(rec)
    m.feed(headers_msg(eos=True, use_value=True))
    assert rec.decisions[0][0][":path"] == "/v1/chat/completions"


def test_buffered_answers_headers_then_routes_on_body_reply():
    rewritten = b'{"model":"other","messages":[]}'
    rec = Recorder(Outcome(set_headers=[("x-gateway-destination-endpoint", "10.0.0.2:8000")], body=rewritten))
    m = RequestMachine(rec)
    out = m.feed(headers_msg(mode=BodyMode.BUFFERED))
    assert kinds(out) == ["request_headers"]
    assert not out[0].request_headers.response.header_mutation.set_headers
    out = m.feed(body_msg(CHAT, True))
    assert kinds(out) == ["request_body"]
    hdrs = set_headers(out[0], "request_body")
    assert hdrs["x-gateway-destination-endpoint"] == b"10.0.0.2:8000"
    assert hdrs["content-length"] == str(len(rewritten)).encode()
    assert out[0].request_body.response.body_mutation.body == rewritten
    assert out[0].request_body.response.clear_route_cache


def test_streamed_with_send_body_without_waiting_holds_headers_then_replies_per_chunk():
    m = RequestMachine(Recorder())
    hdr = headers_msg(mode=BodyMode.STREAMED)
    hdr.protocol_config.send_body_without_waiting_for_header_response = True
    assert m.feed(hdr) == []
    assert m.feed(body_msg(CHAT[:5], False)) == []
    out = m.feed(body_msg(CHAT[5:], True))
    assert kinds(out) == ["request_headers", "request_body", "request_body"]


def test_streamed_waiting_for_headers_picks_on_headers_and_passes_chunks():
    rec = Recorder()
    m = RequestMachine(rec)
    out = m.feed(headers_msg(mode=BodyMode.STREAMED))
    assert kinds(out) == ["request_headers"]
    assert set_headers(out[0], "request_headers")["x-gateway-destination-endpoint"] == b"10.0.0.1:8000"
    assert kinds(m.feed(body_msg(CHAT, True))) == ["request_body"]


def test_reject_sends_immediate_response_and_finishes():
    rec = Recorder(Outcome(reject_status=400, reject_body="inference error: BadRequest - nope"))
    m = RequestMachine(rec)
    m.feed(headers_msg())
    out = m.feed(body_msg(b"{", True))
    assert kinds(out) == ["immediate_response"]
    assert out[0].immediate_response.status.code == 400
    assert out[0].immediate_response.body == b"inference error: BadRequest - nope"
    assert m.finished and m.feed(body_msg(b"", True)) == []


def test_body_over_limit_is_413():
    m = RequestMachine(Recorder(), max_body_bytes=100)
    m.feed(headers_msg())
    assert m.feed(body_msg(b"x" * 60, False)) == []
    out = m.feed(body_msg(b"x" * 60, False))
    assert out[0].immediate_response.status.code == 413
    assert b"PayloadTooLarge" in out[0].immediate_response.body


@pytest.mark.parametrize("mode", [BodyMode.FULL_DUPLEX_STREAMED, BodyMode.STREAMED, BodyMode.BUFFERED])
def test_response_path_in_each_mode(mode):
    rec = Recorder()
    m = RequestMachine(rec)
    m.feed(headers_msg(mode=mode))
    m.feed(body_msg(CHAT, True))
    rh = pb.HttpHeaders()
    rh.headers.headers.append(base_pb2.HeaderValue(key=":status", raw_value=b"200"))
    out = m.feed(pb.ProcessingRequest(response_headers=rh))
    assert kinds(out) == ["response_headers"]
    assert set_headers(out[0], "response_headers") == {"x-served": b"yes"}
    out = m.feed(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: {}\n\n", end_of_stream=False)))
    assert kinds(out) == ["response_body"]
    if mode == BodyMode.FULL_DUPLEX_STREAMED:
        assert out[0].response_body.response.body_mutation.streamed_response.body == b"data: {}\n\n"
    out = m.feed(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    assert kinds(out) == ["response_trailers"]
    assert rec.response_chunks == [(b"data: {}\n\n", False)]


def test_transfer_encoding_is_never_echoed():
    m = RequestMachine(Recorder())
    m.feed(headers_msg(**{"transfer-encoding": "chunked"}))
    out = m.feed(body_msg(CHAT, True))
    hm = out[0].request_headers.response.header_mutation
    assert all(o.header.key != "transfer-encoding" for o in hm.set_headers)
