"""One small policy per request body mode: when the decision is made and how the routing replies are shaped.

The policies are stateless singletons; the per-stream state lives in the machine. Each answers five questions:

| policy | request_headers (no end_of_stream) | body message while collecting | decision | routing replies |
|---|---|---|---|---|
| NONE | decide on headers | violation (never sent) | on headers, body unseen | header reply |
| STREAMED (Envoy waits for the header reply) | decide on headers | - (Envoy waits) | on headers, body unseen | header reply; then one empty reply per chunk |
| STREAMED + send_body_without_waiting | hold | collect | at body end, or early | header reply, then one reply per chunk (the first carries a rewritten body, the rest are cleared; after an early decision later chunks pass) |
| BUFFERED | answer at once (empty) | one message with end_of_stream, else violation | at body end | body reply with the header mutations (+ content-length when rewritten) |
| BUFFERED_PARTIAL | answer at once (empty) | one message: the whole body (end_of_stream) or a partial buffer | at body end, or on headers alone for a partial buffer | body reply with the header mutations |
| FULL_DUPLEX_STREAMED | hold | collect, echo built | at body end, or early | header reply, then each chunk echoed as a `streamed_response` (≤ 62,000 bytes each); after an early decision each later chunk is echoed as it arrives |

Trailers end a body that is still being collected (full duplex and early STREAMED); in BUFFERED modes Envoy sends
the body before the trailers, so trailers there first are a violation.

Early decisions (`streams`: full duplex and STREAMED without waiting): an exchange that reads the body as it
arrives (`BodyReader.request_chunk`) may say after a chunk that it can decide now; the machine then asks for the
decision (Phase.EARLY), keeps the chunks that arrive meanwhile and sends them after the routing replies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.protocol.contract import UNEXPECTED_BODY, BodyMode, Outcome
from epp.protocol.messages import (
    CLEARED_REQUEST_BODY,
    EMPTY_REQUEST_BODY,
    EMPTY_REQUEST_HEADERS,
    REQUEST_TRAILERS,
    buffered_body_reply,
    headers_reply,
    replaced_request_chunk,
    streamed_chunks,
)
from epp.protocol.rawbody import RawBody

if TYPE_CHECKING:
    from epp.protocol.machine import RequestMachine

Replies = list[pb.ProcessingResponse]


class BodyPolicy:
    """The behaviour every mode shares; subclasses override what differs."""

    __slots__ = ()
    mode: BodyMode = BodyMode.NONE
    streams = False  # chunks go to a reading exchange as they come, which may decide early

    def on_headers(self, m: RequestMachine) -> Replies:
        """request_headers without end_of_stream (a body follows). Default: decide on the headers alone."""
        return m.request_decision(None, at_headers=True)

    def on_body(self, m: RequestMachine, msg: pb.HttpBody) -> Replies:
        """A body message while the body is being collected (phase BODY)."""
        return m.violate(UNEXPECTED_BODY, "request_body")

    def on_trailers(self, m: RequestMachine) -> Replies:
        """request_trailers while the body is being collected: they end the body."""
        m.body_ended_by_trailers()
        m.end(trailers=True)
        m.hold(REQUEST_TRAILERS)
        return m.request_decision(m.take_body(), at_headers=False)

    def on_body_while_early(self, m: RequestMachine, msg: pb.HttpBody) -> Replies:
        """A body message while an early decision is pending (phase EARLY): kept for after the routing replies."""
        if m.collect(msg.body, msg.end_of_stream) is None:
            return m.too_large()
        stop = m.rest(msg.body, msg.end_of_stream, counted=True)
        if stop is not None:
            return stop
        if msg.end_of_stream:
            m.end(trailers=False)
        return []

    def routed(self, m: RequestMachine, outcome: Outcome, body: bytes | memoryview | None) -> Replies:
        """The routing replies for a decision made on the body (not on the headers)."""
        return [headers_reply(outcome)]

    def on_late_body(self, m: RequestMachine, msg: pb.HttpBody) -> Replies:
        """A body message after a decision made before the body ended (phase STREAMING)."""
        return m.violate(UNEXPECTED_BODY, "request_body")


class NonePolicy(BodyPolicy):
    __slots__ = ()
    mode = BodyMode.NONE


class StreamedPolicy(BodyPolicy):
    """STREAMED, Envoy waiting for the header reply: the pick is made on headers; each chunk then passes."""

    __slots__ = ()
    mode = BodyMode.STREAMED

    def on_late_body(self, m: RequestMachine, msg: pb.HttpBody) -> Replies:
        if msg.end_of_stream:
            m.end(trailers=False)
        return [EMPTY_REQUEST_BODY]


class _Collecting(BodyPolicy):
    """Modes that see the whole body before the decision."""

    __slots__ = ()

    def on_headers(self, m: RequestMachine) -> Replies:
        return []  # the header reply is held until the body ends

    def on_body(self, m: RequestMachine, msg: pb.HttpBody) -> Replies:
        ready = m.collect(msg.body, msg.end_of_stream)
        if ready is None:
            return m.too_large()
        self.kept(m, msg)
        if not msg.end_of_stream:
            return m.request_decision(None, at_headers=False, early=True) if ready else []
        m.end(trailers=False)
        return m.request_decision(m.take_body(), at_headers=False)

    def kept(self, m: RequestMachine, msg: pb.HttpBody) -> None:
        """A chunk was collected (full duplex builds its echo now)."""


class FullDuplexPolicy(_Collecting):
    __slots__ = ()
    mode = BodyMode.FULL_DUPLEX_STREAMED
    streams = True

    def kept(self, m: RequestMachine, msg: pb.HttpBody) -> None:
        m.echo += _echo(msg)

    def on_body_while_early(self, m: RequestMachine, msg: pb.HttpBody) -> Replies:
        replies = _Collecting.on_body_while_early(self, m, msg)
        if not replies:
            self.kept(m, msg)
        return replies

    def routed(self, m: RequestMachine, outcome: Outcome, body: bytes | memoryview | None) -> Replies:
        replies = [headers_reply(outcome)]
        if not m.body_messages:
            return replies
        # Envoy must get the body back, or upstream gets an empty one
        if outcome.body is None:
            replies += m.echo
        elif m.early_at >= 0:  # an early rewrite replaces the body received up to the decision
            replies += streamed_chunks(outcome.body, False, request=True)
            replies += m.echo[m.echo_at:]
        else:
            replies += streamed_chunks(outcome.body, m.body_eos, request=True)
        return replies

    def on_late_body(self, m: RequestMachine, msg: pb.HttpBody) -> Replies:
        """After an early decision every chunk is echoed as it arrives (the last once the exchange has seen it)."""
        stop = m.rest(msg.body, msg.end_of_stream, counted=False)
        if stop is not None:
            return stop
        if msg.end_of_stream:
            m.end(trailers=False)
        return _echo(msg)


class StreamedEarlyPolicy(_Collecting):
    """STREAMED with send_body_without_waiting_for_header_response: held like full duplex, one reply per chunk."""

    __slots__ = ()
    mode = BodyMode.STREAMED
    streams = True

    def routed(self, m: RequestMachine, outcome: Outcome, body: bytes | memoryview | None) -> Replies:
        n = m.body_messages
        replies = [headers_reply(outcome)]
        if outcome.body is not None and n:
            upto = m.early_at if m.early_at >= 0 else n  # an early rewrite replaces what came before the decision
            replies.append(replaced_request_chunk(outcome.body))
            replies += [CLEARED_REQUEST_BODY] * (upto - 1)
            replies += [EMPTY_REQUEST_BODY] * (n - upto)
        else:
            replies += [EMPTY_REQUEST_BODY] * n
        return replies

    def on_late_body(self, m: RequestMachine, msg: pb.HttpBody) -> Replies:
        stop = m.rest(msg.body, msg.end_of_stream, counted=False)
        if stop is not None:
            return stop
        if msg.end_of_stream:
            m.end(trailers=False)
        return [EMPTY_REQUEST_BODY]


class BufferedPolicy(_Collecting):
    __slots__ = ()
    mode = BodyMode.BUFFERED

    def on_headers(self, m: RequestMachine) -> Replies:
        return [EMPTY_REQUEST_HEADERS]  # Envoy waits for this reply before it buffers the body

    def on_body(self, m: RequestMachine, msg: pb.HttpBody) -> Replies:
        if not msg.end_of_stream:  # Envoy sends the buffered body as one message
            return m.violate(UNEXPECTED_BODY, "request_body")
        return _Collecting.on_body(self, m, msg)

    def on_trailers(self, m: RequestMachine) -> Replies:
        return m.violate(UNEXPECTED_BODY, "request_trailers")

    def routed(self, m: RequestMachine, outcome: Outcome, body: bytes | memoryview | None) -> Replies:
        return [buffered_body_reply(outcome)]


class BufferedPartialPolicy(BufferedPolicy):
    """BUFFERED_PARTIAL: one body message, the whole body or, past Envoy's buffer limit, a partial buffer
    (end_of_stream false) after which the rest of the body passes without Pointsman."""

    __slots__ = ()
    mode = BodyMode.BUFFERED_PARTIAL

    def on_body(self, m: RequestMachine, msg: pb.HttpBody) -> Replies:
        if msg.end_of_stream:
            return _Collecting.on_body(self, m, msg)
        if m.collect(msg.body) is None:
            return m.too_large()
        m.take_body()
        return m.request_decision(None, at_headers=False)  # a partial JSON body cannot be parsed


def _echo(msg: pb.HttpBody | RawBody) -> Replies:
    """The full-duplex echo of a chunk: from its bytes when it was read from the wire (rawbody.py)."""
    if isinstance(msg, RawBody):
        return msg.echo()  # RawReplies are written like ProcessingResponses
    return streamed_chunks(msg.body, msg.end_of_stream, request=True)


NONE = NonePolicy()
STREAMED = StreamedPolicy()
STREAMED_EARLY = StreamedEarlyPolicy()
BUFFERED = BufferedPolicy()
BUFFERED_PARTIAL = BufferedPartialPolicy()
FULL_DUPLEX = FullDuplexPolicy()


_BY_MODE: dict[tuple[int, bool], BodyPolicy] = {
    (BodyMode.NONE, True): NONE, (BodyMode.NONE, False): NONE,
    (BodyMode.STREAMED, True): STREAMED, (BodyMode.STREAMED, False): STREAMED_EARLY,
    (BodyMode.BUFFERED, True): BUFFERED, (BodyMode.BUFFERED, False): BUFFERED,
    (BodyMode.BUFFERED_PARTIAL, True): BUFFERED_PARTIAL, (BodyMode.BUFFERED_PARTIAL, False): BUFFERED_PARTIAL,
    (BodyMode.FULL_DUPLEX_STREAMED, True): FULL_DUPLEX, (BodyMode.FULL_DUPLEX_STREAMED, False): FULL_DUPLEX,
}


def policy_for(mode: int, wait_for_header_reply: bool = True) -> BodyPolicy | None:
    """The policy for an Envoy body mode (send_body_without_waiting_for_header_response matters for STREAMED
    only); None for a mode Pointsman does not know."""
    return _BY_MODE.get((mode, wait_for_header_reply))
