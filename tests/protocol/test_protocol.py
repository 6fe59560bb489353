"""The sans-IO protocol machine, driven through message sequences for every body mode."""

from __future__ import annotations

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.protocol import CHUNK_LIMIT, BodyMode, Outcome
from tests.support.extproc import (
    CHAT,
    Recorder,
    body_msg,
    headers_msg,
    kinds,
    response_headers_msg,
    set_headers,
)
from tests.support.extproc import SyncMachine as Machine


def test_full_duplex_defers_headers_and_echoes_body_in_order():
    rec = Recorder()
    m = Machine(rec)
    assert m.feed(headers_msg(mode=BodyMode.FULL_DUPLEX_STREAMED)) == []
    half = len(CHAT) // 2
    assert m.feed(body_msg(CHAT[:half], False)) == []
    out = m.feed(body_msg(CHAT[half:], True))
    assert kinds(out) == ["request_headers", "request_body", "request_body"]  # each chunk echoed, in order
    hdrs = set_headers(out[0], "request_headers")
    assert hdrs["x-gateway-destination-endpoint"] == b"10.0.0.1:8000"
    assert out[0].request_headers.response.clear_route_cache
    assert out[0].request_headers.response.header_mutation.remove_headers == ["x-gateway-destination-endpoint-served"]
    lb = out[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == "10.0.0.1:8000"
    echoed = [r.request_body.response.body_mutation.streamed_response for r in out[1:]]
    assert b"".join(sr.body for sr in echoed) == CHAT
    assert [sr.end_of_stream for sr in echoed] == [False, True]
    assert rec.decisions[0][1] == CHAT
    assert rec.decisions[0][0][":path"] == "/v1/chat/completions"


def test_full_duplex_large_body_is_rechunked_with_eos_on_last_only():
    body = b"x" * (CHUNK_LIMIT * 3 + 17)
    m = Machine(Recorder())
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
    m = Machine(Recorder())
    m.feed(headers_msg())
    assert m.feed(body_msg(CHAT, False)) == []
    out = m.feed(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    assert kinds(out) == ["request_headers", "request_body", "request_trailers"]
    assert not out[1].request_body.response.body_mutation.streamed_response.end_of_stream


def test_headers_only_request_is_decided_at_once():
    rec = Recorder()
    m = Machine(rec)
    out = m.feed(headers_msg(eos=True, **{":method": "GET"}))
    assert kinds(out) == ["request_headers"]
    assert set_headers(out[0], "request_headers")["x-gateway-destination-endpoint"] == b"10.0.0.1:8000"
    assert rec.decisions[0][1] == b""


def test_body_after_end_of_stream_is_a_violation_and_nothing_is_sent_twice():
    rec = Recorder()
    m = Machine(rec)
    m.feed(headers_msg())
    first = m.feed(body_msg(CHAT, True))
    assert kinds(first) == ["request_headers", "request_body"]
    out = m.feed(body_msg(b"", True))
    assert kinds(out) == ["immediate_response"]
    assert out[0].immediate_response.status.code == 400
    assert out[0].immediate_response.body == (
        b"inference error: BadRequest - ext_proc protocol violation: request_body after the request ended")
    assert m.violation == "request_after_end" and m.finished
    assert m.feed(body_msg(b"", True)) == []  # Envoy closes the stream after an ImmediateResponse
    assert len(rec.decisions) == 1


def test_raw_value_falls_back_to_value():
    rec = Recorder()
    m = Machine(rec)
    m.feed(headers_msg(eos=True, use_value=True))
    assert rec.decisions[0][0][":path"] == "/v1/chat/completions"


def test_buffered_answers_headers_then_routes_on_body_reply():
    rewritten = b'{"model":"other","messages":[]}'
    rec = Recorder(Outcome(set_headers=[("x-gateway-destination-endpoint", "10.0.0.2:8000")], body=rewritten))
    m = Machine(rec)
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
    m = Machine(Recorder())
    hdr = headers_msg(mode=BodyMode.STREAMED)
    hdr.protocol_config.send_body_without_waiting_for_header_response = True
    assert m.feed(hdr) == []
    assert m.feed(body_msg(CHAT[:5], False)) == []
    out = m.feed(body_msg(CHAT[5:], True))
    assert kinds(out) == ["request_headers", "request_body", "request_body"]


def test_streamed_waiting_for_headers_picks_on_headers_and_passes_chunks():
    rec = Recorder()
    m = Machine(rec)
    out = m.feed(headers_msg(mode=BodyMode.STREAMED))
    assert kinds(out) == ["request_headers"]
    assert set_headers(out[0], "request_headers")["x-gateway-destination-endpoint"] == b"10.0.0.1:8000"
    assert kinds(m.feed(body_msg(CHAT, True))) == ["request_body"]


def test_reject_sends_immediate_response_and_finishes():
    rec = Recorder(Outcome(reject_status=400, reject_body="inference error: BadRequest - nope"))
    m = Machine(rec)
    m.feed(headers_msg())
    out = m.feed(body_msg(b"{", True))
    assert kinds(out) == ["immediate_response"]
    assert out[0].immediate_response.status.code == 400
    assert out[0].immediate_response.body == b"inference error: BadRequest - nope"
    assert m.finished and m.feed(body_msg(b"", True)) == []


def test_body_over_limit_is_413():
    m = Machine(Recorder(), max_body_bytes=100)
    m.feed(headers_msg())
    assert m.feed(body_msg(b"x" * 60, False)) == []
    out = m.feed(body_msg(b"x" * 60, False))
    assert out[0].immediate_response.status.code == 413
    assert b"PayloadTooLarge" in out[0].immediate_response.body


@pytest.mark.parametrize("mode", [BodyMode.FULL_DUPLEX_STREAMED, BodyMode.STREAMED, BodyMode.BUFFERED])
def test_response_path_in_each_mode(mode):
    rec = Recorder()
    m = Machine(rec)
    m.feed(headers_msg(mode=mode))
    m.feed(body_msg(CHAT, True))
    out = m.feed(response_headers_msg())
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
    m = Machine(Recorder())
    m.feed(headers_msg(**{"transfer-encoding": "chunked"}))
    out = m.feed(body_msg(CHAT, True))
    hm = out[0].request_headers.response.header_mutation
    assert all(o.header.key != "transfer-encoding" for o in hm.set_headers)
