"""Every message either advances a phase or is handled by a written rule: the tables, each rule, async decisions."""

from __future__ import annotations

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.protocol import (
    KINDS,
    RESPONSE_TABLE,
    RULES,
    TABLE,
    BodyMode,
    Outcome,
    Phase,
    RequestMachine,
    ResponsePhase,
)
from tests.support.extproc import (
    CHAT,
    Recorder,
    SyncMachine,
    body_msg,
    headers_msg,
    inflight,
    kinds,
    real_director,
    response_body_msg,
    response_headers_msg,
    response_trailers_msg,
    set_config,
    set_headers,
    trailers_msg,
)

FD, BUF, PART, STR, NONE = (BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED, BodyMode.BUFFERED_PARTIAL,
                            BodyMode.STREAMED, BodyMode.NONE)


def test_every_phase_and_kind_has_a_handler():
    assert set(TABLE) == set(Phase)
    assert all(len(row) == len(KINDS) and all(callable(h) for h in row) for row in TABLE.values())
    assert set(RESPONSE_TABLE) == set(ResponsePhase)
    assert all(len(row) == 3 for row in RESPONSE_TABLE.values())


def test_rules_have_distinct_kinds_and_gie_error_codes():
    assert len({r.kind for r in RULES}) == len(RULES)
    for r in RULES:
        assert (r.status, r.code) in {(400, "BadRequest"), (500, "Internal")}


def run(messages: list[pb.ProcessingRequest], exchange=None, **kw) -> tuple[SyncMachine, list[list[str]]]:
    m = SyncMachine(exchange or Recorder(), **kw)
    return m, [kinds(m.feed(msg)) for msg in messages]


def violation_reply(m: SyncMachine, msg: pb.ProcessingRequest) -> pb.ImmediateResponse:
    out = m.feed(msg)
    assert kinds(out) == ["immediate_response"], kinds(out)
    assert m.finished and m.phase is Phase.CLOSED
    return out[0].immediate_response


VIOLATIONS = [
    # (name, messages before, offending message, kind, status, text)
    ("empty first", [], pb.ProcessingRequest(), "empty_message", 400,
     "a ProcessingRequest with no message set"),
    ("empty mid-body", [headers_msg()], pb.ProcessingRequest(), "empty_message", 400, None),
    ("headers twice", [headers_msg()], headers_msg(), "request_headers_repeated", 400,
     "request_headers received twice"),
    ("eos headers twice", [headers_msg(eos=True)], headers_msg(eos=True), "request_headers_repeated", 400, None),
    ("headers after the request", [headers_msg(), body_msg(CHAT, True)], headers_msg(), "request_headers_repeated",
     400, None),
    ("body before headers", [], body_msg(CHAT, True), "request_before_headers", 500,
     "request_body before request_headers (Pointsman routes on the request headers: request_header_mode must be SEND)"),
    ("trailers before headers", [], trailers_msg(), "request_before_headers", 500, None),
    ("body after eos", [headers_msg(), body_msg(CHAT, True)], body_msg(b"", True), "request_after_end", 400,
     "request_body after the request ended"),
    ("body after eos headers", [headers_msg(eos=True)], body_msg(CHAT, True), "request_after_end", 400, None),
    ("body after trailers", [headers_msg(), body_msg(CHAT, False), trailers_msg()], body_msg(b"x", False),
     "request_after_end", 400, None),
    ("trailers twice", [headers_msg(), body_msg(CHAT, False), trailers_msg()], trailers_msg(), "request_after_end",
     400, None),
    ("body in mode NONE", [headers_msg(mode=NONE)], body_msg(CHAT, True), "request_unexpected", 500,
     "request_body that Envoy does not send here in request body mode NONE (do the processing modes of Envoy and "
     "Pointsman agree?)"),
    ("BUFFERED chunk without eos", [headers_msg(mode=BUF)], body_msg(CHAT, False), "request_unexpected", 500, None),
    ("BUFFERED trailers before body", [headers_msg(mode=BUF)], trailers_msg(), "request_unexpected", 500, None),
    ("BUFFERED_PARTIAL second chunk", [headers_msg(mode=PART), body_msg(CHAT, False)], body_msg(b"x", False),
     "request_unexpected", 500, None),
    ("response headers twice", [headers_msg(eos=True), response_headers_msg()], response_headers_msg(),
     "response_out_of_order", 400, "response_headers out of order (repeated, or after the response body ended)"),
    ("response headers after body", [headers_msg(eos=True), response_body_msg(b"x", False)], response_headers_msg(),
     "response_out_of_order", 400, None),
    ("response body after its end", [headers_msg(eos=True), response_headers_msg(), response_body_msg(b"x", True)],
     response_body_msg(b"y", False), "response_out_of_order", 400, None),
    ("response body after eos headers", [headers_msg(eos=True), response_headers_msg(eos=True)],
     response_body_msg(b"y", True), "response_out_of_order", 400, None),
    ("response trailers twice", [headers_msg(eos=True), response_trailers_msg()], response_trailers_msg(),
     "response_out_of_order", 400, None),
    ("request after a local reply", [response_headers_msg()], headers_msg(), "request_after_response", 400,
     "request_headers after the response began without the request being routed"),
    ("unknown body mode", [], set_config(headers_msg(), 5, 4), "unsupported_mode", 500, None),
    ("unknown response mode", [], set_config(headers_msg(), 4, 9), "unsupported_mode", 500, None),
]


@pytest.mark.parametrize(("before", "msg", "kind", "status", "text"), [v[1:] for v in VIOLATIONS],
                         ids=[v[0] for v in VIOLATIONS])
def test_violation_rule(before, msg, kind, status, text):
    rec = Recorder()
    m = SyncMachine(rec)
    for b in before:
        assert "immediate_response" not in kinds(m.feed(b))
    decided = len(rec.decisions)
    ir = violation_reply(m, msg)
    assert ir.status.code == status
    code = "BadRequest" if status == 400 else "Internal"
    assert ir.body.decode().startswith(f"inference error: {code} - ext_proc protocol violation: ")
    if text is not None:
        assert ir.body.decode() == f"inference error: {code} - ext_proc protocol violation: {text}"
    assert m.violation == kind
    assert len(rec.decisions) == decided <= 1, "a violation never causes a decision"
    # Messages Envoy had already sent before it saw the ImmediateResponse are ignored.
    for late in (headers_msg(), body_msg(b"x", True), trailers_msg(), response_headers_msg(), pb.ProcessingRequest()):
        assert m.feed(late) == []


def test_duplicated_end_of_stream_headers_decide_once_and_leave_no_inflight():
    director = real_director()
    for _ in range(20):
        ex = director.exchange()
        m = SyncMachine(ex)
        first = m.feed(headers_msg(eos=True, method="GET", path="/v1/models"))
        assert kinds(first) == ["request_headers"]
        assert inflight(director) == 1
        second = m.feed(headers_msg(eos=True, method="GET", path="/v1/models"))
        assert kinds(second) == ["immediate_response"] and m.violation == "request_headers_repeated"
        assert inflight(director) == 1
        ex.close()
        assert inflight(director) == 0
    assert director.datastore.inflight.view() == {}


# ---- rules that are not violations ------------------------------------------------------------------------------
def test_a_stream_that_begins_with_a_local_reply_is_answered_and_never_decided():
    rec = Recorder()
    m, out = run([set_config(response_headers_msg(), FD, FD), response_body_msg(b"413", True)], rec)
    assert out == [["response_headers"], ["response_body"]]
    assert m.phase is Phase.ABANDONED and rec.decisions == [] and m.violation is None


def test_a_local_reply_while_the_body_is_collected_abandons_the_request():
    rec = Recorder()
    m, out = run([headers_msg(mode=BUF), response_headers_msg(), response_body_msg(b"too large", True)], rec)
    assert out == [["request_headers"], ["response_headers"], ["response_body"]]
    assert rec.decisions == [] and m.phase is Phase.ABANDONED
    assert kinds(m.feed(body_msg(CHAT, True))) == ["immediate_response"]
    assert m.violation == "request_after_response"


def test_an_early_response_while_a_streamed_request_body_still_flows():
    m, out = run([headers_msg(mode=STR), body_msg(b"a", False), response_headers_msg(), body_msg(b"b", False),
                  response_body_msg(b"r", False), body_msg(b"", True), response_body_msg(b"", True)])
    assert out == [["request_headers"], ["request_body"], ["response_headers"], ["request_body"], ["response_body"],
                   ["request_body"], ["response_body"]]
    assert m.phase is Phase.COMPLETE and m.violation is None


def test_trailers_after_an_end_of_stream_body_are_answered_once():
    m, out = run([headers_msg(), body_msg(CHAT, True), trailers_msg()])
    assert out == [[], ["request_headers", "request_body"], ["request_trailers"]]
    assert m.violation is None


def test_full_duplex_trailers_without_a_body_get_no_body_reply():
    m, out = run([headers_msg(), trailers_msg()])
    assert out == [[], ["request_headers", "request_trailers"]]


def test_lean_response_phases_only_trailers():
    m, out = run([headers_msg(mode=FD, response_mode=NONE), body_msg(CHAT, True), response_trailers_msg()])
    assert out == [[], ["request_headers", "request_body"], ["response_trailers"]]
    assert m.response_phase is ResponsePhase.DONE


def test_response_headers_may_be_skipped():
    m, out = run([headers_msg(eos=True), response_body_msg(b"a", False), response_body_msg(b"b", True),
                  response_trailers_msg()])
    assert out == [["request_headers"], ["response_body"], ["response_body"], ["response_trailers"]]


# ---- body modes ----------------------------------------------------------------------------------------------------
def test_buffered_partial_whole_body_routes_like_buffered():
    rewritten = b'{"model":"x"}'
    rec = Recorder(Outcome(set_headers=[("x-gateway-destination-endpoint", "10.0.0.2:8000")], body=rewritten))
    m = SyncMachine(rec)
    assert kinds(m.feed(headers_msg(mode=PART))) == ["request_headers"]
    out = m.feed(body_msg(CHAT, True))
    assert kinds(out) == ["request_body"]
    assert rec.decisions[0][1] == CHAT
    hdrs = set_headers(out[0], "request_body")
    assert hdrs["x-gateway-destination-endpoint"] == b"10.0.0.2:8000"
    assert hdrs["content-length"] == str(len(rewritten)).encode()
    assert out[0].request_body.response.body_mutation.body == rewritten
    assert m.phase is Phase.COMPLETE


def test_buffered_partial_partial_buffer_routes_on_headers():
    rec = Recorder()
    m = SyncMachine(rec)
    assert kinds(m.feed(headers_msg(mode=PART))) == ["request_headers"]
    out = m.feed(body_msg(CHAT[:10], False))
    assert kinds(out) == ["request_body"]
    assert set_headers(out[0], "request_body")["x-gateway-destination-endpoint"] == b"10.0.0.1:8000"
    assert rec.decisions[0][1] is None, "a partial JSON body is not parsed"
    assert m.phase is Phase.STREAMING
    assert kinds(m.feed(trailers_msg())) == ["request_trailers"]


def test_streamed_early_rewrite_replaces_the_first_chunk_and_clears_the_rest():
    rewritten = b'{"model":"other","messages":[]}'
    rec = Recorder(Outcome(set_headers=[("x-gateway-destination-endpoint", "10.0.0.2:8000")], body=rewritten))
    m = SyncMachine(rec)
    assert m.feed(headers_msg(mode=STR, wait=False)) == []
    assert m.feed(body_msg(CHAT[:5], False)) == []
    assert m.feed(body_msg(CHAT[5:9], False)) == []
    out = m.feed(body_msg(CHAT[9:], True))
    assert kinds(out) == ["request_headers", "request_body", "request_body", "request_body"]
    assert "content-length" not in set_headers(out[0], "request_headers")
    assert out[1].request_body.response.body_mutation.body == rewritten
    assert out[2].request_body.response.body_mutation.clear_body
    assert out[3].request_body.response.body_mutation.clear_body
    assert rec.decisions[0][1] == CHAT


def test_none_mode_decides_on_headers_with_the_body_unseen():
    rec = Recorder()
    m, out = run([headers_msg(mode=NONE), trailers_msg()], rec)
    assert out == [["request_headers"], ["request_trailers"]]
    assert rec.decisions[0][1] is None


def test_full_duplex_rewrite_is_echoed_in_chunks():
    big = b'{"model":"m","pad":"' + b"x" * 130_000 + b'"}'
    rec = Recorder(Outcome(set_headers=[("a", "b")], body=big))
    m = SyncMachine(rec)
    m.feed(headers_msg())
    out = m.feed(body_msg(CHAT, True))
    chunks = [r.request_body.response.body_mutation.streamed_response for r in out[1:]]
    assert len(chunks) == 3 and b"".join(c.body for c in chunks) == big
    assert [c.end_of_stream for c in chunks] == [False, False, True]


# ---- asynchronous decisions, sans-IO -----------------------------------------------------------------------------
def test_a_pending_decision_holds_the_trailers_reply_until_the_outcome():
    rec = Recorder()
    m = RequestMachine(rec)
    assert m.feed(headers_msg()) == []
    assert m.feed(body_msg(CHAT, True)) == [] and m.phase is Phase.DECIDING
    assert m.decision is not None and m.decision.body == CHAT and not m.decision.at_headers
    assert m.feed(trailers_msg()) == []  # held: the header and body replies come first
    out = m.resolve(rec.outcome)
    assert kinds(out) == ["request_headers", "request_body", "request_trailers"]
    assert out[1].request_body.response.body_mutation.streamed_response.end_of_stream
    assert m.phase is Phase.COMPLETE and m.decision is None
    assert m.resolve(rec.outcome) == [], "an outcome is taken once"


def test_trailers_that_end_the_body_while_deciding_on_headers():
    m = RequestMachine(Recorder())
    m.feed(headers_msg(mode=STR))
    assert m.phase is Phase.DECIDING and m.decision.at_headers and m.decision.body is None
    assert m.feed(trailers_msg()) == []
    assert kinds(m.resolve(Recorder().outcome)) == ["request_headers", "request_trailers"]
    assert m.phase is Phase.COMPLETE


def test_a_body_while_deciding_on_headers_is_a_violation():
    m = RequestMachine(Recorder())
    m.feed(headers_msg(mode=STR))
    assert violation_reply(m, body_msg(CHAT, False)).status.code == 500
    assert m.violation == "request_unexpected" and m.decision is None
    assert m.resolve(Recorder().outcome) == [], "the late outcome is dropped"


def test_a_local_reply_while_deciding_drops_the_decision():
    rec = Recorder()
    m = RequestMachine(rec)
    m.feed(headers_msg())
    m.feed(body_msg(CHAT, True))
    m.feed(trailers_msg())
    assert kinds(m.feed(response_headers_msg())) == ["response_headers"]
    assert m.phase is Phase.ABANDONED and m.decision is None
    assert m.resolve(rec.outcome) == []
    assert kinds(m.feed(response_body_msg(b"x", True))) == ["response_body"]


def test_a_rejected_outcome_ends_the_stream_and_drops_held_replies():
    m = RequestMachine(Recorder())
    m.feed(headers_msg())
    m.feed(body_msg(CHAT, True))
    m.feed(trailers_msg())
    out = m.resolve(Outcome(reject_status=429, reject_body="inference error: ResourceExhausted - busy"))
    assert kinds(out) == ["immediate_response"] and m.finished and m.violation is None
