"""What the protocol machine exchanges with its driver and with the director: modes, decisions, outcomes, rules."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


class BodyMode(enum.IntEnum):
    """Mirrors envoy ProcessingMode.BodySendMode."""

    NONE = 0
    STREAMED = 1
    BUFFERED = 2
    BUFFERED_PARTIAL = 3
    FULL_DUPLEX_STREAMED = 4

    @classmethod
    def parse(cls, text: str) -> BodyMode:
        try:
            return cls[text.strip().upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"unknown body mode {text!r}; expected one of {[m.name for m in cls]}") from None


@dataclass(slots=True)
class Outcome:
    """What to do with a complete request: route it (set/remove headers, metadata, maybe a new body) or reject it."""

    set_headers: list[tuple[str, str]] = field(default_factory=list)
    remove_headers: list[str] = field(default_factory=list)
    metadata: Mapping[str, Mapping[str, object]] | None = None  # namespace -> fields (dynamic_metadata)
    body: bytes | None = None  # a rewritten request body
    clear_route_cache: bool = True
    # Rejection: an ImmediateResponse ends the request.
    reject_status: int = 0
    reject_body: str = ""
    reject_headers: list[tuple[str, str]] = field(default_factory=list)


class Decision(NamedTuple):
    """The machine's request for a decision (it is in Phase.DECIDING until `resolve` gets the outcome).

    `body` is None when a body exists but cannot be seen before the pick (STREAMED mode where Envoy waits for the
    header reply, body mode NONE, a partial BUFFERED_PARTIAL buffer); b"" when the request has no body."""

    headers: Mapping[str, str]
    body: bytes | memoryview | None  # a body read from the wire: a view of its message
    metadata: Mapping[str, Mapping[str, object]]
    at_headers: bool  # the reply goes on the request headers (else the body policy shapes it)
    early: bool = False  # made before the body ended (Phase.EARLY): the exchange saw the chunks so far


class BodyReader(Protocol):
    """What an exchange that reads the request body as it streams in offers (optional: the machine uses it when
    the exchange has `request_chunk`). Such an exchange is given `body=None` by `decide`: it read the body itself."""

    def request_chunk(self, headers: Mapping[str, str], data: bytes | memoryview, end_of_stream: bool) -> bool:
        """One request body chunk, before the decision (`end_of_stream` also when trailers end the body, with an
        empty chunk); a chunk read from the wire is a view of its message, valid as long as it is kept. True: the
        decision can be made now, before the body ends (an early decision)."""
        ...

    def request_rest(self, data: bytes | memoryview, end_of_stream: bool) -> Outcome | None:
        """One request body chunk after an early decision was asked for (`end_of_stream` also when trailers end
        the body, with an empty chunk). None: go on; an Outcome (a rejection): the body contradicts what the
        decision read, and the request ends with it instead of its last chunk."""
        ...


class Exchange(Protocol):
    """The per-request callbacks; implemented by the director (epp.request.director.RequestExchange)."""

    def decide(
        self, headers: Mapping[str, str], body: bytes | memoryview | None,
        metadata: Mapping[str, Mapping[str, object]],
    ) -> Outcome | Awaitable[Outcome]:
        """Decide for a request (see `Decision` for `body`). Called at most once per stream, by the driver.

        An Outcome is used at once; an awaitable is awaited while the stream is still read, and is cancelled if
        the stream ends first. Whatever it commits (in-flight counts) must be released by `close`."""
        ...

    def response_headers(
        self, headers: Mapping[str, str], metadata: Mapping[str, Mapping[str, object]]
    ) -> list[tuple[str, str]]:
        """Observe the response headers; return headers to set on the response."""
        ...

    def response_body(self, chunk: bytes, end_of_stream: bool) -> bytes:
        """Observe (and possibly rewrite) one response body chunk; return what to send on."""
        ...

    def response_end(self) -> None:
        """The response ended with trailers (a body's end is seen by `response_body`)."""
        ...

    def close(self) -> None:
        """The stream ended, for whatever reason. Called exactly once by the driver, after any decision settled."""
        ...


class Rule(NamedTuple):
    """A protocol violation: the label it is counted under, and the ImmediateResponse it gets."""

    kind: str
    status: int
    code: str
    text: str  # str.format template; {kind} is the offending message kind, {mode} the request body mode

    def body(self, kind: str | None, mode: str) -> str:
        return f"inference error: {self.code} - ext_proc protocol violation: " + self.text.format(
            kind=kind or "an empty message", mode=mode
        )


EMPTY_MESSAGE = Rule("empty_message", 400, "BadRequest", "a ProcessingRequest with no message set")
HEADERS_REPEATED = Rule("request_headers_repeated", 400, "BadRequest", "request_headers received twice")
BEFORE_HEADERS = Rule(
    "request_before_headers", 500, "Internal",
    "{kind} before request_headers (Pointsman routes on the request headers: request_header_mode must be SEND)",
)
AFTER_END = Rule("request_after_end", 400, "BadRequest", "{kind} after the request ended")
UNEXPECTED_BODY = Rule(
    "request_unexpected", 500, "Internal",
    "{kind} that Envoy does not send here in request body mode {mode} (do the processing modes of Envoy and "
    "Pointsman agree?)",
)
AFTER_RESPONSE = Rule(
    "request_after_response", 400, "BadRequest", "{kind} after the response began without the request being routed"
)
RESPONSE_OUT_OF_ORDER = Rule(
    "response_out_of_order", 400, "BadRequest", "{kind} out of order (repeated, or after the response body ended)"
)
UNSUPPORTED_MODE = Rule("unsupported_mode", 500, "Internal", "protocol_config names a body mode Pointsman does not know")

RULES = (EMPTY_MESSAGE, HEADERS_REPEATED, BEFORE_HEADERS, AFTER_END, UNEXPECTED_BODY, AFTER_RESPONSE,
         RESPONSE_OUT_OF_ORDER, UNSUPPORTED_MODE)
