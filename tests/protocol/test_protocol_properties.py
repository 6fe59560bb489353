"""Property tests: random ext_proc message sequences, Envoy-shaped and hostile, through the machine and a real director.

Invariants, for every stream in every body mode and response-phase setting:
- no exception escapes the machine or the director;
- at most one request-header reply, at most one ImmediateResponse and nothing after it;
- a reply of each kind only answers received messages of that kind (never more replies than messages), and the
  replies of one side come in order: headers, then body, then trailers;
- once every stream has ended (finished, truncated, cancelled with a decision pending, or closed for a violation),
  the real InflightTracker is back to 0.
Envoy-shaped streams are also never treated as violations and get every reply Envoy waits for.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.protocol import KINDS, BodyMode, Phase, RequestMachine
from epp.request.director import Director
from tests.support.extproc import (
    ENDPOINTS,
    LOAD_ONLY,
    body_msg,
    headers_msg,
    inflight,
    real_director,
    response_body_msg,
    response_headers_msg,
    response_trailers_msg,
    set_config,
    trailers_msg,
)

FD, BUF, STR, NONE = BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED, BodyMode.STREAMED, BodyMode.NONE
# (request body mode, Envoy waits for the header reply before sending the body)
MODES = [(FD, True), (BUF, True), (STR, True), (STR, False)]
PHASES = ["full", "lean"]
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DESTINATIONS = {f"{ip}:{port}".encode() for ip, port in ENDPOINTS}
REQUEST_SIDE = ("request_headers", "request_body", "request_trailers")
DECIDING = (Phase.DECIDING, Phase.EARLY)
EARLY_MODES = [(FD, True), (STR, False)]  # the modes that stream chunks to a reading exchange
RESPONSE_SIDE = ("response_headers", "response_body", "response_trailers")


# ---- strategies --------------------------------------------------------------------------------------------------
def chat(content: str) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@st.composite
def envoy_stream(draw: st.DrawFn, mode: BodyMode, wait: bool, phases: str) -> list[pb.ProcessingRequest]:
    """The messages Envoy sends for one request in this processing mode, possibly cut short."""
    msgs: list[pb.ProcessingRequest] = []
    if draw(st.integers(0, 5)) == 0:  # a GET: end_of_stream on the headers
        msgs.append(headers_msg(eos=True, method="GET", path="/v1/models"))
    else:
        msgs.append(headers_msg())
        body = chat(draw(st.text(max_size=40)))
        with_trailers = draw(st.booleans())
        if mode == BUF:  # one message with the whole body; trailers (if any) after it
            msgs.append(body_msg(body, True))
            if with_trailers:
                msgs.append(trailers_msg())
        else:
            pieces = split(body, draw(st.lists(st.integers(0, len(body)), max_size=3)))
            msgs += [body_msg(p, False) for p in pieces]
            if with_trailers:  # trailers end the body
                msgs.append(trailers_msg())
            elif draw(st.booleans()):  # an empty last chunk carries end_of_stream (as Envoy 1.40 does)
                msgs.append(body_msg(b"", True))
            else:
                msgs[-1].request_body.end_of_stream = True
    set_config(msgs[0], mode, mode if phases == "full" else NONE, wait)
    if phases == "full":
        eos = draw(st.integers(0, 6)) == 0
        msgs.append(response_headers_msg(eos=eos))
        if not eos:
            reply = b'{"usage":{"prompt_tokens":3,"completion_tokens":1}}'
            if mode == BUF:
                msgs.append(response_body_msg(reply, True))
            else:
                msgs += [response_body_msg(p, False) for p in split(reply, draw(st.lists(st.integers(0, 60),
                                                                                          max_size=3)))]
                msgs.append(response_body_msg(b"", True))
        if draw(st.booleans()):
            msgs.append(response_trailers_msg())
    elif draw(st.booleans()):
        msgs.append(response_trailers_msg())
    cut = draw(st.integers(0, len(msgs))) if draw(st.booleans()) else len(msgs)  # the client went away
    return msgs[:cut]


@st.composite
def any_message(draw: st.DrawFn) -> pb.ProcessingRequest:
    kind = draw(st.sampled_from(KINDS))
    eos = draw(st.booleans())
    data = draw(st.sampled_from([chat("x"), b"", b"{", b"not json", b"x" * 300]))
    if kind == "request_headers":
        msg = headers_msg(eos=eos, method=draw(st.sampled_from(["POST", "GET"])))
    elif kind == "request_body":
        msg = body_msg(data, eos)
    elif kind == "request_trailers":
        msg = trailers_msg()
    elif kind == "response_headers":
        msg = response_headers_msg(eos=eos)
    elif kind == "response_body":
        msg = response_body_msg(data, eos)
    elif kind == "response_trailers":
        msg = response_trailers_msg()
    else:
        msg = pb.ProcessingRequest()
    if draw(st.integers(0, 4)) == 0:
        set_config(msg, draw(st.integers(0, 6)), draw(st.integers(0, 6)), draw(st.booleans()))
    return msg


@st.composite
def mutated(draw: st.DrawFn, stream: st.SearchStrategy[list[pb.ProcessingRequest]]) -> list[pb.ProcessingRequest]:
    """An Envoy-shaped stream with messages duplicated, dropped, swapped or inserted."""
    msgs = list(draw(stream))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["dup", "drop", "swap", "insert"]))
        i = draw(st.integers(0, max(len(msgs) - 1, 0)))
        if op == "insert" or not msgs:
            msgs.insert(i, draw(any_message()))
        elif op == "dup":
            msgs.insert(i, msgs[i])
        elif op == "drop":
            del msgs[i]
        else:
            j = draw(st.integers(0, len(msgs) - 1))
            msgs[i], msgs[j] = msgs[j], msgs[i]
    return msgs


@dataclass
class Plan:
    """How the driver treats a stream's decision: 0 = synchronous (the grpc fast path); k > 0 = an awaitable
    that completes after k more messages. `finish_late`: a decision still pending when the stream ends (or no
    longer wanted) completes anyway and commits, as a cancel that came too late would."""

    delay: int = 0
    finish_late: bool = False


plans = st.builds(Plan, delay=st.integers(0, 3), finish_late=st.booleans())


# ---- the driver and the invariants ---------------------------------------------------------------------------------
@dataclass
class Sim:
    """One stream driven like the grpc layer drives it, recording every reply with what had been received."""

    director: Director
    msgs: list[pb.ProcessingRequest]
    plan: Plan
    mode: BodyMode = FD
    wait: bool = True
    envoy_order: bool = False
    received: Counter = field(default_factory=Counter)
    replies: list[tuple[str, Counter]] = field(default_factory=list)
    raw: list[pb.ProcessingResponse] = field(default_factory=list)
    decide_calls: int = 0

    def __post_init__(self) -> None:
        self.exchange = self.director.exchange()
        self.machine = RequestMachine(self.exchange, request_body_mode=self.mode, response_body_mode=self.mode,
                                      send_body_without_waiting=not self.wait)
        self.pos = 0
        self.pending: int | None = None  # messages left before the awaitable decision completes
        self.closed = False

    def emit(self, replies: list[pb.ProcessingResponse]) -> None:
        for r in replies:
            self.replies.append((r.WhichOneof("response"), Counter(self.received)))
            self.raw.append(r)

    def complete_decision(self) -> None:
        d = self.machine.decision
        assert d is not None
        self.decide_calls += 1
        self.emit(self.machine.resolve(self.exchange.decide(d.headers, d.body, d.metadata)))
        self.pending = None

    def step(self) -> bool:
        """Feed one message (or let a pending decision complete). False once the stream is over."""
        m = self.machine
        if self.closed:
            return False
        if self.pending == 0:
            self.complete_decision()
            return True
        if self.pos >= len(self.msgs) or m.finished:
            self.end()
            return False
        msg = self.msgs[self.pos]
        kind = msg.WhichOneof("request")
        if self.pending is not None and self.envoy_order and kind != "request_trailers":
            # Envoy sends nothing else before it has the routing reply.
            self.complete_decision()
            return True
        self.pos += 1
        self.received[kind] += 1
        was_deciding = self.pending is not None
        self.emit(m.feed(msg))
        if self.pending is not None:
            self.pending -= 1
        if m.phase in DECIDING and not was_deciding:
            if self.plan.delay == 0:
                self.complete_decision()
            else:
                self.pending = self.plan.delay
        elif was_deciding and m.phase not in DECIDING:  # abandoned or closed: the decision is cancelled
            self.cancel_pending()
        return True

    def cancel_pending(self) -> None:
        """The driver cancels the pending decision; with `finish_late` it had already committed."""
        m = self.machine
        if self.plan.finish_late:
            self.decide_calls += 1
            d = m.decision
            outcome = self.exchange.decide(m.headers, d.body if d else b"", m.metadata)
            if m.phase not in DECIDING:
                assert m.resolve(outcome) == [], "a decision no longer wanted is dropped"
        self.pending = None

    def end(self) -> None:
        if self.pending is not None:  # the stream ended with the decision pending: it is cancelled
            self.cancel_pending()
        self.exchange.close()
        self.closed = True


def run(director: Director, sims: list[Sim], schedule: list[int]) -> None:
    for i in schedule:  # interleave the streams
        sims[i % len(sims)].step()
    for s in sims:
        while s.step():
            pass


def check_stream(s: Sim) -> None:
    kinds_out = [k for k, _ in s.replies]
    assert kinds_out.count("request_headers") <= 1, kinds_out
    assert kinds_out.count("immediate_response") <= 1
    if "immediate_response" in kinds_out:
        assert kinds_out[-1] == "immediate_response", "nothing after an ImmediateResponse"
    assert s.decide_calls <= 1, "decided twice"
    sent: Counter = Counter()
    for kind, received in s.replies:
        if kind == "immediate_response":
            continue
        sent[kind] += 1
        assert sent[kind] <= received[kind], f"{kind} reply #{sent[kind]} with {received[kind]} received"
    for side in (REQUEST_SIDE, RESPONSE_SIDE):
        order = [side.index(k) for k in kinds_out if k in side]
        assert order == sorted(order), f"out of order: {kinds_out}"


def check_envoy_shaped(s: Sim) -> None:
    """A well-formed stream is never a violation and gets every reply Envoy waits for."""
    m = s.machine
    assert m.violation is None, (m.violation, [msg.WhichOneof("request") for msg in s.msgs])
    assert not m.finished, s.raw[-1]  # Envoy-shaped chat requests are routed, never rejected
    got = Counter(k for k, _ in s.replies)
    rcv = s.received
    if m.phase in (Phase.STREAMING, Phase.COMPLETE):  # routed
        assert got["request_headers"] == 1
        on_body = s.mode == BUF and rcv["request_body"] > 0
        route = next(r for r in s.raw if r.WhichOneof("response") == ("request_body" if on_body else
                                                                        "request_headers"))
        common = getattr(route, route.WhichOneof("response")).response
        dest = {h.header.key: h.header.raw_value for h in common.header_mutation.set_headers}
        assert dest["x-gateway-destination-endpoint"] in DESTINATIONS
    if m.phase is Phase.COMPLETE:
        assert got["request_trailers"] == rcv["request_trailers"]
        if s.mode == FD:
            assert (got["request_body"] >= 1) == (rcv["request_body"] >= 1)
        else:
            assert got["request_body"] == rcv["request_body"]
    for kind in RESPONSE_SIDE:
        assert got[kind] == rcv[kind]


def director_after(sims: list[Sim], director: Director) -> None:
    assert all(s.closed for s in sims)
    assert inflight(director) == 0 and director.datastore.inflight.view() == {}


Scenario = tuple[BodyMode, bool, list[tuple[list[pb.ProcessingRequest], Plan]], list[int]]


# ---- the properties ------------------------------------------------------------------------------------------------
@st.composite
def scenario(draw: st.DrawFn, hostile: bool) -> Scenario:
    mode, wait = draw(st.sampled_from(MODES))
    phases = draw(st.sampled_from(PHASES))
    shaped = envoy_stream(mode, wait, phases)
    n = draw(st.integers(1, 5))
    streams = []
    for _ in range(n):
        if not hostile:
            msgs = draw(shaped)
        else:
            msgs = draw(st.one_of(shaped, mutated(shaped), st.lists(any_message(), max_size=8)))
        streams.append((msgs, draw(plans) if hostile else Plan()))
    schedule = draw(st.lists(st.integers(0, n - 1), max_size=30))
    return mode, wait, streams, schedule


@PROPERTY
@given(scenario(hostile=False))
def test_envoy_shaped_streams_route_once_and_release_inflight(case):
    mode, wait, streams, schedule = case
    director = real_director()
    sims = [Sim(director, msgs, plan, mode, wait) for msgs, plan in streams]
    run(director, sims, schedule)
    for s in sims:
        check_stream(s)
        check_envoy_shaped(s)
    director_after(sims, director)


@PROPERTY
@given(scenario(hostile=True))
def test_hostile_streams_with_async_decisions_keep_every_invariant(case):
    mode, wait, streams, schedule = case
    director = real_director()
    sims = [Sim(director, msgs, plan, mode, wait) for msgs, plan in streams]
    run(director, sims, schedule)
    for s in sims:
        check_stream(s)
    director_after(sims, director)


@PROPERTY
@given(st.sampled_from(MODES), st.sampled_from(PHASES), st.data())
def test_envoy_shaped_streams_with_awaitable_decisions(mode_wait, phases, data):
    """Decisions complete later; meanwhile only what Envoy may still send arrives (request trailers)."""
    mode, wait = mode_wait
    director = real_director()
    s = Sim(director, data.draw(envoy_stream(mode, wait, phases)), data.draw(plans), mode, wait, envoy_order=True)
    run(director, [s], [])
    check_stream(s)
    check_envoy_shaped(s)
    director_after([s], director)


# ---- early decisions ---------------------------------------------------------------------------------------------
@st.composite
def early_scenario(draw: st.DrawFn, hostile: bool) -> Scenario:
    mode, wait = draw(st.sampled_from(EARLY_MODES))
    phases = draw(st.sampled_from(PHASES))
    shaped = envoy_stream(mode, wait, phases)
    n = draw(st.integers(1, 4))
    streams = []
    for _ in range(n):
        msgs = draw(st.one_of(shaped, mutated(shaped))) if hostile else draw(shaped)
        streams.append((msgs, draw(plans)))
    return mode, wait, streams, draw(st.lists(st.integers(0, n - 1), max_size=30))


@PROPERTY
@given(early_scenario(hostile=False))
def test_early_decisions_keep_every_invariant_on_envoy_shaped_streams(case):
    """A scheduler that reads no prompt: a chunked request whose model has arrived is decided before its body ends
    (Phase.EARLY). The chunks that come while it decides, and after, are all answered, in order, once."""
    mode, wait, streams, schedule = case
    director = real_director(config=LOAD_ONLY)
    sims = [Sim(director, msgs, plan, mode, wait) for msgs, plan in streams]
    run(director, sims, schedule)
    for s in sims:
        check_stream(s)
        check_envoy_shaped(s)
        if s.mode == FD and s.machine.phase is Phase.COMPLETE:  # the body went back whole, in order
            sent = b"".join(r.request_body.response.body_mutation.streamed_response.body for r in s.raw
                            if r.WhichOneof("response") == "request_body")
            got = b"".join(m.request_body.body for m in s.msgs[: s.pos] if m.WhichOneof("request") == "request_body")
            assert sent == got
    director_after(sims, director)


@PROPERTY
@given(early_scenario(hostile=True))
def test_early_decisions_keep_every_invariant_on_hostile_streams(case):
    mode, wait, streams, schedule = case
    director = real_director(config=LOAD_ONLY)
    sims = [Sim(director, msgs, plan, mode, wait) for msgs, plan in streams]
    run(director, sims, schedule)
    for s in sims:
        check_stream(s)
    director_after(sims, director)


def test_early_decisions_happen_and_answer_the_rest_as_it_comes():
    """Not vacuous: a full-duplex chat body in three chunks, model first, is routed after the first chunk; each
    later chunk is echoed as it arrives."""
    from tests.support.extproc import SyncMachine, body_msg, headers_msg

    director = real_director(config=LOAD_ONLY)
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=FD)
    body = chat("hello " * 50)
    a, b = 20, 60
    assert m.feed(headers_msg()) == []
    first = m.feed(body_msg(body[:a], False))
    assert [r.WhichOneof("response") for r in first] == ["request_headers", "request_body"]
    assert ex.early == "m" and m.phase is Phase.STREAMING
    second = m.feed(body_msg(body[a:b], False))
    third = m.feed(body_msg(body[b:], True))
    echoed = [r.request_body.response.body_mutation.streamed_response for r in first[1:] + second + third]
    assert b"".join(e.body for e in echoed) == body and [e.end_of_stream for e in echoed] == [False, False, True]
    assert m.phase is Phase.COMPLETE and inflight(director) == 1
    ex.close()
    assert inflight(director) == 0
