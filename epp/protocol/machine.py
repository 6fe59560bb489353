"""The ext_proc protocol machine: sans-IO, one instance per Envoy stream (one HTTP request).

Theory of operation
===================

Envoy opens one ext_proc stream per HTTP request and sends ProcessingRequests, each carrying exactly one of
request_headers, request_body, request_trailers, response_headers, response_body, response_trailers. The machine is
fed those messages in stream order (`feed`) and returns the ProcessingResponses to send, in order. It does no I/O,
knows nothing of grpc or scheduling, and never waits: when a routing decision is needed it says so and takes the
outcome later as an input, the way h11 hands events to its caller.

The request side of a stream moves through these phases (`Phase`):

    IDLE ──request_headers──> BODY ──(body ends, or the mode decides on headers)──> DECIDING
      │  (end_of_stream: no body) ───────────────────────────────────────────────────> DECIDING
      │                         BODY ──(the exchange can decide before the body ends)──> EARLY
      │                                       DECIDING or EARLY ──resolve()──> STREAMING or COMPLETE
      │                                                  STREAMING ──body end / trailers──> COMPLETE
      └─ a response message before the request was routed (IDLE, BODY, DECIDING) ──> ABANDONED
    any phase ──ImmediateResponse (a rejection, 413, or a protocol violation)──> CLOSED

- BODY: the headers are in and the body is being collected (or, in BUFFERED modes, awaited after an empty header
  reply). What a body message does here is the body mode's policy (`epp.protocol.policies`).
- DECIDING: `decision` holds the `Decision` to make. The driver asks the exchange and calls `resolve(outcome)`,
  at once or later (an awaitable decision). Messages that arrive meanwhile follow the table; replies that must
  come after the routing replies (request trailers) are held and sent by `resolve`, so ordering is kept.
- EARLY: an early decision (FULL_DUPLEX_STREAMED, or STREAMED without waiting for the header reply): the exchange
  reads the chunks as they come (`request_chunk`) and said after one of them that it can decide now. Envoy keeps
  sending chunks meanwhile: they are kept, with their echo built, and sent after the routing replies, in order;
  trailers end the body as in BODY; the outcome comes as in DECIDING.
- STREAMING: routed before the request ended (decided on headers, on a partial buffer, or early); chunks still
  flow and each is answered as it comes (echoed in full duplex). After an early decision they still count against
  `max_body_bytes`, and the exchange sees each (`request_rest`, from EARLY on): at the body's end it may answer
  that the body contradicts what the decision read (a top-level `model` repeated after the decision point), and
  that rejection replaces the last chunk's answer, so the upstream never gets a complete request.
- COMPLETE: routed and the request is over; only the response (and at most one request_trailers) remain.
- ABANDONED: a response began before the request was routed. Envoy does this when a local reply (a codec error,
  a 413 from a buffer limit, another filter's rejection) runs through the ext_proc filter's encoder side. The
  request is never decided (a pending decision is dropped) and the response phase is answered.
- CLOSED: an ImmediateResponse was sent; Envoy closes the stream. Messages it had already sent are ignored.

The response side has its own small machine (`ResponsePhase`, in `epp.protocol.response`): WAITING → HEADERS →
BODY → BODY_ENDED → DONE, where headers may be skipped (response_header_mode SKIP) and trailers may come at any
point before DONE.

Every (phase, message kind) pair has an entry in TABLE, and every (response phase, kind) pair in RESPONSE_TABLE
(`epp.protocol.response`): each message either advances a phase or is handled by a written rule. A violation gets
an ImmediateResponse `inference error: <Code> - ext_proc protocol violation: ...` (the rules are in
`epp.protocol.contract`), closes the stream and is reported in `violation` for the driver to count.

Guarantees: a decision is requested at most once per stream (no phase leads back to DECIDING), so at most one
request-header reply is ever sent and in-flight counts go up at most once; the driver calls `exchange.close()`
exactly once. Replies answer only messages that were received, in stream order: header, then body, then trailers.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.protocol import contract as rules
from epp.protocol.contract import BodyMode, Decision, Exchange, Outcome, Rule
from epp.protocol.messages import (
    REQUEST_TRAILERS,
    headers_reply,
    immediate,
    read_headers,
    read_metadata,
    rejection,
)
from epp.protocol.policies import BodyPolicy, policy_for
from epp.protocol.rawbody import RawBody
from epp.protocol.response import RESPONSE_KINDS, ResponsePhase, respond

Replies = list[pb.ProcessingResponse]


class Phase(enum.IntEnum):
    IDLE = 0
    BODY = 1
    DECIDING = 2
    STREAMING = 3
    COMPLETE = 4
    ABANDONED = 5
    CLOSED = 6
    EARLY = 7


class RequestMachine:
    """Feed it ProcessingRequests in stream order and send what `feed` (and `resolve`) return, in order.

    `decision` is set by the `feed` that enters DECIDING and stays set until the outcome arrives: the driver asks
    the exchange once, right after that feed, and passes the outcome to `resolve` (at once, or later while it keeps
    feeding). If the machine leaves DECIDING without it (a violation, a local reply), `decision` is cleared and the
    driver cancels what it started. Once `finished` is set the stream is over; `violation` names the broken rule."""

    __slots__ = ("exchange", "policy", "response_mode", "max_body_bytes", "phase", "response_phase", "headers",
                 "metadata", "decision", "violation", "finished", "body_messages", "body_eos", "trailers", "_chunks",
                 "_size", "_ended", "_held", "reader", "rest_reader", "echo", "early_at", "echo_at")

    def __init__(
        self,
        exchange: Exchange,
        *,
        request_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED,
        response_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED,
        send_body_without_waiting: bool = False,
        max_body_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.exchange = exchange
        policy = policy_for(request_body_mode, not send_body_without_waiting)
        if policy is None:
            raise ValueError(f"unknown request body mode {request_body_mode!r}")
        self.policy: BodyPolicy = policy
        self.response_mode = BodyMode(response_body_mode)
        self.max_body_bytes = max_body_bytes
        self.phase = Phase.IDLE
        self.response_phase = ResponsePhase.WAITING
        self.headers: dict[str, str] = {}
        self.metadata: dict[str, dict[str, object]] = {}
        self.decision: Decision | None = None
        self.violation: str | None = None  # the Rule.kind that closed the stream, if any
        self.finished = False  # an ImmediateResponse was sent: the stream is over
        self.body_messages = 0  # request body messages collected before the decision
        self.body_eos = False  # the request body ended with end_of_stream (not with trailers)
        self.trailers = False  # request trailers were received
        self._chunks: list[bytes] = []
        self._size = 0
        self._ended = False  # the request (body) is over
        self._held: Replies | None = None  # replies to send after the routing replies
        # An exchange that reads the body as it streams in (contract.BodyReader): it gets every chunk and may ask
        # for an early decision; the body is then not joined for it.
        self.reader = getattr(exchange, "request_chunk", None)
        self.rest_reader = getattr(exchange, "request_rest", None)  # and the chunks after an early decision
        self.echo: Replies = []  # full duplex: the echo of each chunk, built as it arrives
        self.early_at = -1  # body messages received when an early decision was asked for
        self.echo_at = 0  # and the echo replies built by then

    # ---- the driver's interface ----------------------------------------------------------------------------------
    def feed(self, req: pb.ProcessingRequest) -> Replies:
        kind = req.WhichOneof("request")
        return _DISPATCH[self.phase][kind](self, req, kind)

    def feed_body(self, chunk: RawBody) -> Replies:
        """A request body message read from the wire (epp.protocol.rawbody): the same as `feed`, and in full duplex
        its echo replies are `RawReply`s (the chunk's bytes, not copied)."""
        return _DISPATCH[self.phase]["request_body"](self, chunk, "request_body")

    def resolve(self, outcome: Outcome) -> Replies:
        """The outcome of `decision`. Dropped (returns []) if the stream left DECIDING meanwhile (abandoned or
        closed): whatever the exchange committed for it is released by `exchange.close()`."""
        d = self.decision
        if (self.phase is not Phase.DECIDING and self.phase is not Phase.EARLY) or d is None:
            return []
        self.decision = None
        if outcome.reject_status:
            return self._close(rejection(outcome))
        replies = [headers_reply(outcome)] if d.at_headers else self.policy.routed(self, outcome, d.body)
        self.echo = []
        self.phase = Phase.COMPLETE if self._ended else Phase.STREAMING
        if self._held:
            replies += self._held
            self._held = None
        return replies

    # ---- what the policies use -----------------------------------------------------------------------------------
    def request_decision(self, body: bytes | memoryview | None, *, at_headers: bool, early: bool = False) -> Replies:
        self.decision = Decision(self.headers, body, self.metadata, at_headers, early)
        if early:
            self.early_at, self.echo_at = self.body_messages, len(self.echo)
        self.phase = Phase.EARLY if early else Phase.DECIDING
        return []

    def collect(self, data: bytes | memoryview, end_of_stream: bool = False) -> bool | None:
        """Keep a body chunk (and show it to a reading exchange); None when the body grew past max_body_bytes,
        else whether the exchange can decide now (always False on the last chunk). A chunk read from the wire (a
        view of its message) is kept, and shown to the exchange, as a view: not copied."""
        self.body_messages += 1
        self._size += len(data)
        if self._size > self.max_body_bytes:
            return None
        if data:
            self._chunks.append(data)  # type: ignore[arg-type]  # b"".join takes views too
        reader = self.reader
        if reader is None or not self.policy.streams or self.phase is not Phase.BODY:
            return False
        return bool(reader(self.headers, data, end_of_stream)) and not end_of_stream

    def rest(self, data: bytes | memoryview, end_of_stream: bool, *, counted: bool) -> Replies | None:
        """A chunk after an early decision was asked for (`counted`: `collect` has counted it already). None to go
        on; else the replies that end the stream: the body grew past max_body_bytes, or the exchange found at its
        end that it contradicts the decision (`BodyReader.request_rest`)."""
        if self.early_at < 0:
            return None
        if not counted:
            self._size += len(data)
            if self._size > self.max_body_bytes:
                return self.too_large()
        check = self.rest_reader
        outcome = check(data, end_of_stream) if check is not None else None
        return None if outcome is None else self._close(rejection(outcome))

    def body_ended_by_trailers(self) -> None:
        if self.reader is not None and self.policy.streams and self.phase is Phase.BODY:
            self.reader(self.headers, b"", True)

    def take_body(self) -> bytes | memoryview | None:
        """The body collected so far; None when a reading exchange has read it (the streaming modes). A body that
        came in one message read from the wire is that message's view, not a copy."""
        chunks = self._chunks
        self._chunks = []
        if self.reader is not None and self.policy.streams:
            return None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def end(self, *, trailers: bool) -> None:
        if trailers:
            self.trailers = True
        elif not self._ended:
            self.body_eos = True
        self._ended = True
        if self.phase is Phase.STREAMING:
            self.phase = Phase.COMPLETE

    def hold(self, reply: pb.ProcessingResponse) -> None:
        if self._held is None:
            self._held = [reply]
        else:
            self._held.append(reply)

    def too_large(self) -> Replies:
        return self._close(immediate(
            413, f"inference error: PayloadTooLarge - request body exceeds the {self.max_body_bytes}-byte limit"))

    def violate(self, rule: Rule, kind: str | None) -> Replies:
        self.violation = rule.kind
        return self._close(immediate(rule.status, rule.body(kind, self.policy.mode.name)))

    # ---- internals -----------------------------------------------------------------------------------------------
    def _close(self, reply: pb.ProcessingResponse) -> Replies:
        self.phase = Phase.CLOSED
        self.finished = True
        self.decision = None
        self._held = None
        self._chunks = []
        self.echo = []
        return [reply]

    def _configure(self, req: pb.ProcessingRequest) -> bool:
        """protocol_config comes with the first message only (whatever its kind)."""
        if not req.HasField("protocol_config"):
            return True
        pc = req.protocol_config
        policy = policy_for(pc.request_body_mode, not pc.send_body_without_waiting_for_header_response)
        response_mode = _MODES.get(pc.response_body_mode)
        if policy is None or response_mode is None:
            return False
        self.policy = policy
        self.response_mode = response_mode
        return True


_MODES = {int(m): m for m in BodyMode}
Handler = Callable[[RequestMachine, pb.ProcessingRequest, str | None], Replies]


# ---- request-side handlers -------------------------------------------------------------------------------------
def _request_headers(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    if not m._configure(req):
        return m.violate(rules.UNSUPPORTED_MODE, kind)
    h = req.request_headers
    m.headers = read_headers(h)
    m.metadata = read_metadata(req)
    if h.end_of_stream:  # no body (a GET): decide now
        m.end(trailers=False)
        return m.request_decision(b"", at_headers=True)
    m.phase = Phase.BODY
    return m.policy.on_headers(m)


def _collect_body(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    return m.policy.on_body(m, req.request_body)


def _collect_trailers(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    return m.policy.on_trailers(m)


def _body_while_deciding(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    # The decision is made when the body ends, or on headers when Envoy waits for the header reply before it
    # sends the body: either way Envoy sends no body now.
    return m.violate(rules.AFTER_END if m._ended else rules.UNEXPECTED_BODY, kind)


def _trailers_while_deciding(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    if m.trailers:
        return m.violate(rules.AFTER_END, kind)
    m.end(trailers=True)
    m.hold(REQUEST_TRAILERS)  # answered after the routing replies
    return []


def _body_while_early(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    # Envoy does not wait for the routing reply in the modes that decide early: keep the chunk for after it.
    return m.policy.on_body_while_early(m, req.request_body)


def _trailers_while_early(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    if m._ended:
        return m.violate(rules.AFTER_END, kind)
    stop = m.rest(b"", True, counted=True)
    if stop is not None:
        return stop
    m.end(trailers=True)
    m.hold(REQUEST_TRAILERS)
    return []


def _late_body(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    return m.policy.on_late_body(m, req.request_body)


def _late_trailers(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    # Trailers end a request still streaming; after a body that ended with end_of_stream they are answered too
    # (older Envoys add empty trailers when trailer mode is SEND). Once only.
    if m.trailers:
        return m.violate(rules.AFTER_END, kind)
    if not m._ended:  # they end a body still streaming
        stop = m.rest(b"", True, counted=True)
        if stop is not None:
            return stop
    m.end(trailers=True)
    return [REQUEST_TRAILERS]


def _local_reply(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    """A response before the request was routed: Envoy is sending a local reply. Abandon the request."""
    if m.phase is Phase.IDLE and not m._configure(req):
        return m.violate(rules.UNSUPPORTED_MODE, kind)
    m.phase = Phase.ABANDONED
    m.decision = None
    m._held = None
    m._chunks = []
    m.echo = []
    return respond(m, req, kind)


def _ignore(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    return []


def _violation(rule: Rule) -> Handler:
    def handler(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
        return m.violate(rule, kind)

    handler.__name__ = f"violate_{rule.kind}"
    return handler


_empty = _violation(rules.EMPTY_MESSAGE)
_repeated = _violation(rules.HEADERS_REPEATED)
_before_headers = _violation(rules.BEFORE_HEADERS)
_after_end = _violation(rules.AFTER_END)
_after_response = _violation(rules.AFTER_RESPONSE)


# ---- the tables --------------------------------------------------------------------------------------------------
KINDS: tuple[str | None, ...] = ("request_headers", "request_body", "request_trailers", *RESPONSE_KINDS,
                                 None)  # None: a ProcessingRequest with no message set

# (phase, message kind) -> handler, one row per phase, columns in KINDS order.
TABLE: dict[Phase, tuple[Handler, ...]] = {
    #                  request_headers    request_body          request_trailers          response_headers / body / trailers          empty
    Phase.IDLE:      (_request_headers, _before_headers,      _before_headers,          _local_reply, _local_reply, _local_reply, _empty),
    Phase.BODY:      (_repeated,        _collect_body,        _collect_trailers,        _local_reply, _local_reply, _local_reply, _empty),
    Phase.DECIDING:  (_repeated,        _body_while_deciding, _trailers_while_deciding, _local_reply, _local_reply, _local_reply, _empty),
    Phase.STREAMING: (_repeated,        _late_body,           _late_trailers,           respond,      respond,      respond,      _empty),
    Phase.COMPLETE:  (_repeated,        _after_end,           _late_trailers,           respond,      respond,      respond,      _empty),
    Phase.ABANDONED: (_after_response,  _after_response,      _after_response,          respond,      respond,      respond,      _empty),
    Phase.CLOSED:    (_ignore,          _ignore,              _ignore,                  _ignore,      _ignore,      _ignore,      _ignore),
    Phase.EARLY:     (_repeated,        _body_while_early,    _trailers_while_early,    _local_reply, _local_reply, _local_reply, _empty),
}  # fmt: skip

# Compiled for the hot path: a tuple indexed by phase of dicts keyed by message kind.
_DISPATCH: tuple[dict[str | None, Handler], ...] = tuple(
    dict(zip(KINDS, TABLE[p], strict=True)) for p in Phase)
