"""The response side of the ext_proc protocol machine (machine.py): its phases, handlers and table.

Once the request is routed (or abandoned to a local reply), response messages go here: WAITING → HEADERS → BODY →
BODY_ENDED → DONE, where headers may be skipped (response_header_mode SKIP) and trailers may come at any point
before DONE. Every (response phase, kind) pair has an entry in RESPONSE_TABLE; a message out of that order is the
RESPONSE_OUT_OF_ORDER violation.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.protocol import contract as rules
from epp.protocol.messages import (
    RESPONSE_TRAILERS,
    read_headers,
    read_metadata,
    response_body_replies,
    response_headers_reply,
)

if TYPE_CHECKING:
    from epp.protocol.machine import Handler, Replies, RequestMachine


class ResponsePhase(enum.IntEnum):
    WAITING = 0
    HEADERS = 1
    BODY = 2
    BODY_ENDED = 3
    DONE = 4


def respond(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    """A response message, in whatever phase the request side is in (STREAMING, COMPLETE, ABANDONED)."""
    return _RESPONSE_DISPATCH[m.response_phase][kind](m, req, kind)


def _response_headers(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    h = req.response_headers
    sets = m.exchange.response_headers(read_headers(h), read_metadata(req))
    m.response_phase = ResponsePhase.BODY_ENDED if h.end_of_stream else ResponsePhase.HEADERS
    return [response_headers_reply(sets)]


def _response_body(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    body = req.response_body
    data = m.exchange.response_body(body.body, body.end_of_stream)
    m.response_phase = ResponsePhase.BODY_ENDED if body.end_of_stream else ResponsePhase.BODY
    return response_body_replies(body.body, data, body.end_of_stream, m.response_mode)


def _response_trailers(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    m.response_phase = ResponsePhase.DONE
    m.exchange.response_end()
    return [RESPONSE_TRAILERS]


def _response_violation(m: RequestMachine, req: pb.ProcessingRequest, kind: str | None) -> Replies:
    return m.violate(rules.RESPONSE_OUT_OF_ORDER, kind)


_response_violation.__name__ = f"violate_{rules.RESPONSE_OUT_OF_ORDER.kind}"  # as machine.py names its violations

RESPONSE_KINDS: tuple[str, ...] = ("response_headers", "response_body", "response_trailers")
# (response phase, response message kind) -> handler.
RESPONSE_TABLE: dict[ResponsePhase, tuple[Handler, ...]] = {
    #                             response_headers      response_body         response_trailers
    ResponsePhase.WAITING:    (_response_headers,   _response_body,       _response_trailers),
    ResponsePhase.HEADERS:    (_response_violation, _response_body,       _response_trailers),
    ResponsePhase.BODY:       (_response_violation, _response_body,       _response_trailers),
    ResponsePhase.BODY_ENDED: (_response_violation, _response_violation,  _response_trailers),
    ResponsePhase.DONE:       (_response_violation, _response_violation,  _response_violation),
}  # fmt: skip

# Compiled for the hot path: a tuple indexed by phase of dicts keyed by message kind.
_RESPONSE_DISPATCH: tuple[dict[str | None, Handler], ...] = tuple(
    dict(zip(RESPONSE_KINDS, RESPONSE_TABLE[p], strict=True)) for p in ResponsePhase)
