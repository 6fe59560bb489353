"""W3C Trace Context parsing: what is accepted, what is ignored, from headers and from gRPC metadata."""

from epp.request.tracecontext import (
    UNSAMPLED,
    find_parent,
    format_traceparent,
    from_headers,
    from_metadata,
    parse_traceparent,
    trace_id_of,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def test_a_valid_traceparent_and_its_state():
    tp = parse_traceparent(f"00-{TRACE}-{SPAN}-01", "a=1, b=2")
    assert tp is not None and tp.sampled
    assert (f"{tp.trace_id:032x}", f"{tp.span_id:016x}", tp.tracestate) == (TRACE, SPAN, "a=1,b=2")
    assert format_traceparent(tp.trace_id, tp.span_id, True) == f"00-{TRACE}-{SPAN}-01"
    assert not parse_traceparent(f"00-{TRACE}-{SPAN}-00").sampled


def test_invalid_headers_are_ignored_with_their_state():
    for bad in (f"ff-{TRACE}-{SPAN}-01", f"00-{'0' * 32}-{SPAN}-01", f"00-{TRACE}-{'0' * 16}-01",
                f"00-{TRACE.upper()}-{SPAN}-01", f"00-{TRACE}-{SPAN}", f"00-{TRACE}-{SPAN}-01-extra",
                f"0-{TRACE}-{SPAN}-01", f"00-{TRACE[:-1]}-{SPAN}-01", f"00-{TRACE}-{SPAN}-zz", "", None):
        assert parse_traceparent(bad, "a=1") is None, bad
    assert trace_id_of(f"ff-{TRACE}-{SPAN}-01") == ""
    # A later version may append fields; version 00 may not.
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-01-more") is not None


def test_tracestate_without_traceparent_is_dropped_and_long_state_is_cut():
    assert from_headers({"tracestate": "a=1"}) is None
    tp = parse_traceparent(f"00-{TRACE}-{SPAN}-01", ",".join(f"k{i}=v" for i in range(40)))
    assert tp.tracestate.count(",") == 31
    # Past 512 characters: members over 128 go first, then members from the end.
    long, short = "big=" + "x" * 200, [f"k{i}=" + "v" * 60 for i in range(10)]
    state = parse_traceparent(f"00-{TRACE}-{SPAN}-01", ",".join([short[0], long, *short[1:]])).tracestate
    assert len(state) <= 512 and "big=" not in state
    assert state == ",".join(short[:8])  # 8 x 63 characters and 7 commas: 511


def test_metadata_as_either_transport_reports_it():
    aio = (("user-agent", "envoy"), ("traceparent", f"00-{TRACE}-{SPAN}-01"), ("tracestate", "e=1"))
    h2 = [(b":path", b"/x"), (b"traceparent", f"00-{TRACE}-{SPAN}-01".encode()), (b"tracestate", b"e=1")]
    for md in (aio, h2):
        tp = from_metadata(md)
        assert tp is not None and f"{tp.span_id:016x}" == SPAN and tp.tracestate == "e=1"
    assert from_metadata(None) is None and from_metadata([(b"te", b"trailers")]) is None


def test_the_parent_is_the_metadata_s_else_the_headers_and_an_unsampled_one_is_known_by_its_flags():
    md = [(b"te", b"trailers"), (b"traceparent", f"00-{TRACE}-{SPAN}-00".encode()), (b"tracestate", b"e=1")]
    client = {"traceparent": f"00-{TRACE}-{'1' * 16}-01", "tracestate": "c=1"}
    assert find_parent(md, client, sampled_only=True) == (UNSAMPLED, "envoy")  # the ids were never needed
    parent, source = find_parent(md, client)
    assert source == "envoy" and (f"{parent.span_id:016x}", parent.sampled, parent.tracestate) == (SPAN, False, "e=1")
    bad = [(b"traceparent", f"00-{'0' * 32}-{SPAN}-01".encode()), (b"tracestate", b"e=1")]
    parent, source = find_parent(bad, client, sampled_only=True)  # an invalid parent in the metadata: the client's
    assert source == "client" and parent.sampled and parent.span_id == int("1" * 16, 16) and parent.tracestate == "c=1"
    assert find_parent(None, {}) == (None, "") and find_parent(bad, {"traceparent": "junk"}) == (None, "")
