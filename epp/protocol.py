"""The sans-IO ext_proc protocol machine: one instance per Envoy stream (one HTTP request).

It is fed `ProcessingRequest` messages and returns the `ProcessingResponse` messages to send, in order. It knows
the body modes, reply ordering, chunking and end-of-stream rules. It knows nothing of grpc or scheduling: once the
request is complete it asks its `Exchange` (supplied by the director) for an `Outcome`.

Rules it follows (see shared/reference/ext-proc-protocol.md):
- FULL_DUPLEX_STREAMED: the header reply is deferred until the body ends; then header → body → trailers, the body
  echoed as `streamed_response` chunks of at most 62,000 bytes with end_of_stream on the last one (unless trailers
  ended the body). Every trailers message gets a TrailersResponse.
- BUFFERED: Envoy waits for the header reply, so the headers are answered at once, and the routing mutations go in
  the body reply (with Content-Length when the body was rewritten).
- STREAMED: with `send_body_without_waiting_for_header_response` the header reply is held like full duplex and each
  chunk then gets its own reply; without it Envoy waits, so the pick is made from the headers alone.
- A request without a body (end_of_stream on the headers) is decided at once.
- Header values are read from raw_value, falling back to value; mutations set only raw_value.
- Duplicate end_of_stream messages are tolerated; nothing is ever sent twice.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

CHUNK_LIMIT = 62_000


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


class Exchange(Protocol):
    """The per-request callbacks the machine needs; implemented by the director."""

    def decide(
        self, headers: Mapping[str, str], body: bytes | None, metadata: Mapping[str, Mapping[str, object]]
    ) -> Outcome:
        """Decide for a complete request. `body` is None when it exists but cannot be seen before the pick
        (STREAMED mode where Envoy waits for the header reply)."""
        ...

    def response_headers(
        self, headers: Mapping[str, str], metadata: Mapping[str, Mapping[str, object]]
    ) -> list[tuple[str, str]]:
        """Observe the response headers; return headers to set on the response."""
        ...

    def response_body(self, chunk: bytes, end_of_stream: bool) -> bytes:
        """Observe (and possibly rewrite) one response body chunk; return what to send on."""
        ...

    def close(self) -> None:
        """The stream ended, for whatever reason. Called exactly once by the machine's owner."""
        ...


class ProtocolError(Exception):
    pass


def read_headers(hdrs: pb.HttpHeaders) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in hdrs.headers.headers:
        raw = h.raw_value
        value = raw.decode("utf-8", "replace") if raw else h.value
        key = h.key.lower()
        if key in out:
            out[key] = out[key] + "," + value
        else:
            out[key] = value
    return out


def struct_to_dict(s: struct_pb2.Struct) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in s.fields.items():
        kind = v.WhichOneof("kind")
        if kind == "string_value":
            out[k] = v.string_value
        elif kind == "list_value":
            out[k] = [x.string_value if x.WhichOneof("kind") == "string_value" else x for x in v.list_value.values]
        elif kind == "struct_value":
            out[k] = struct_to_dict(v.struct_value)
        elif kind == "number_value":
            out[k] = v.number_value
        elif kind == "bool_value":
            out[k] = v.bool_value
        else:
            out[k] = None
    return out


def read_metadata(req: pb.ProcessingRequest) -> dict[str, dict[str, object]]:
    if not req.HasField("metadata_context"):
        return {}
    return {ns: struct_to_dict(s) for ns, s in req.metadata_context.filter_metadata.items()}


def header_mutation(set_headers: list[tuple[str, str]], remove: list[str]) -> pb.HeaderMutation:
    hm = pb.HeaderMutation(remove_headers=remove)
    for k, v in set_headers:
        hm.set_headers.append(
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        )
    return hm


def dynamic_metadata(metadata: Mapping[str, Mapping[str, object]]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    for ns, fields in metadata.items():
        s.fields[ns].struct_value.update(fields)
    return s


def immediate(status: int, body: str, headers: list[tuple[str, str]] | None = None) -> pb.ProcessingResponse:
    hdrs = [("content-type", "text/plain; charset=utf-8"), *(headers or [])]
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=header_mutation(hdrs, []),
            body=body.encode(),
            details=body[:200],
        )
    )


def streamed_chunks(data: bytes, end_of_stream: bool, request: bool) -> list[pb.ProcessingResponse]:
    """Full-duplex body replies: ≤ CHUNK_LIMIT bytes each, end_of_stream on the last one only."""
    n = len(data)
    if n <= CHUNK_LIMIT:
        sbr = pb.StreamedBodyResponse(body=data, end_of_stream=end_of_stream)
        br = pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=sbr)))
        return [pb.ProcessingResponse(request_body=br) if request else pb.ProcessingResponse(response_body=br)]
    out: list[pb.ProcessingResponse] = []
    offsets = range(0, n, CHUNK_LIMIT) if n else [0]
    last = offsets[-1]
    for off in offsets:
        sbr = pb.StreamedBodyResponse(body=data[off : off + CHUNK_LIMIT], end_of_stream=end_of_stream and off == last)
        br = pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=sbr)))
        out.append(pb.ProcessingResponse(request_body=br) if request else pb.ProcessingResponse(response_body=br))
    return out


_EMPTY_REQ_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
_EMPTY_REQ_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse())
_EMPTY_RESP_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse())
_REQ_TRAILERS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
_RESP_TRAILERS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


class RequestMachine:
    """Feed it ProcessingRequests in stream order; send what `feed` returns, in order."""

    def __init__(
        self,
        exchange: Exchange,
        *,
        request_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED,
        response_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED,
        max_body_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.exchange = exchange
        self.req_mode = request_body_mode
        self.resp_mode = response_body_mode
        self.wait_for_headers = True  # Envoy waits for the header reply before it sends the body
        self.max_body_bytes = max_body_bytes
        self._headers: dict[str, str] = {}
        self._metadata: dict[str, dict[str, object]] = {}
        self._chunks: list[bytes] = []
        self._size = 0
        self._pending_chunk_replies = 0  # STREAMED: body messages received before the header reply was sent
        self._decided = False
        self._header_replied = False
        self._body_done = False
        self._trailers_seen = False
        self.finished = False  # an ImmediateResponse was sent: the stream is over
        self._first = True

    # ---- entry point ---------------------------------------------------------------------------------------------
    def feed(self, req: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        if self.finished:
            return []
        if self._first:
            self._first = False
            if req.HasField("protocol_config"):
                pc = req.protocol_config
                self.req_mode = BodyMode(pc.request_body_mode)
                self.resp_mode = BodyMode(pc.response_body_mode)
                self.wait_for_headers = not pc.send_body_without_waiting_for_header_response
        kind = req.WhichOneof("request")
        if kind == "request_headers":
            return self._on_request_headers(req)
        if kind == "request_body":
            return self._on_request_body(req.request_body)
        if kind == "request_trailers":
            return self._on_request_trailers()
        if kind == "response_headers":
            return self._on_response_headers(req)
        if kind == "response_body":
            return self._on_response_body(req.response_body)
        if kind == "response_trailers":
            return [_RESP_TRAILERS]
        return []

    # ---- request path --------------------------------------------------------------------------------------------
    def _on_request_headers(self, req: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        self._headers = read_headers(req.request_headers)
        self._metadata = read_metadata(req)
        if req.request_headers.end_of_stream or self.req_mode == BodyMode.NONE:
            self._body_done = req.request_headers.end_of_stream
            return self._decide_on_headers()
        holds = self.req_mode == BodyMode.FULL_DUPLEX_STREAMED or (
            self.req_mode == BodyMode.STREAMED and not self.wait_for_headers
        )
        if holds:
            return []
        if self.req_mode == BodyMode.STREAMED:
            # Envoy waits for this reply before streaming the body, so the pick must be made from headers alone.
            return self._decide_on_headers()
        # BUFFERED / BUFFERED_PARTIAL: answer now; the decision rides on the body reply.
        self._header_replied = True
        return [_EMPTY_REQ_HEADERS]

    def _decide_on_headers(self) -> list[pb.ProcessingResponse]:
        outcome = self._decide(b"" if self._body_done else None)
        if outcome.reject_status:
            return [self._reject(outcome)]
        self._header_replied = True
        return [self._headers_reply(outcome)]

    def _on_request_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if self._body_done:
            # A duplicate end_of_stream (or a stray chunk after the decision): pass data through, never reply twice.
            if not body.body:
                return []
            if self.req_mode == BodyMode.FULL_DUPLEX_STREAMED:
                return streamed_chunks(body.body, False, request=True)
            return [_EMPTY_REQ_BODY]
        if self._decided:
            # STREAMED mode decided on headers: every chunk passes through unchanged.
            if body.end_of_stream:
                self._body_done = True
            if self.req_mode == BodyMode.FULL_DUPLEX_STREAMED:
                return streamed_chunks(body.body, body.end_of_stream, request=True)
            return [_EMPTY_REQ_BODY]
        self._size += len(body.body)
        if self._size > self.max_body_bytes:
            return [self._reject_too_large()]
        if body.body:
            self._chunks.append(body.body)
        if self.req_mode == BodyMode.STREAMED:
            self._pending_chunk_replies += 1
        if not body.end_of_stream:
            return []
        self._body_done = True
        return self._complete_request(trailers=False)

    def _on_request_trailers(self) -> list[pb.ProcessingResponse]:
        self._trailers_seen = True
        if self._decided or self.finished:
            return [_REQ_TRAILERS]
        # Trailers end the body.
        self._body_done = True
        out = self._complete_request(trailers=True)
        if not self.finished:
            out.append(_REQ_TRAILERS)
        return out

    def _complete_request(self, *, trailers: bool) -> list[pb.ProcessingResponse]:
        body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks = []
        outcome = self._decide(body)
        if outcome.reject_status:
            return [self._reject(outcome)]
        new_body = outcome.body if outcome.body is not None else body
        mode = self.req_mode
        if mode == BodyMode.FULL_DUPLEX_STREAMED:
            self._header_replied = True
            return [self._headers_reply(outcome), *streamed_chunks(new_body, not trailers, request=True)]
        if mode == BodyMode.STREAMED:
            # Held header reply (send_body_without_waiting_for_header_response), then one reply per chunk.
            self._header_replied = True
            replies = [self._headers_reply(outcome)]
            replies += [_EMPTY_REQ_BODY] * self._pending_chunk_replies
            self._pending_chunk_replies = 0
            return replies
        # BUFFERED: the headers were answered already; the routing mutations go in the body reply.
        sets = list(outcome.set_headers)
        common = pb.CommonResponse(clear_route_cache=outcome.clear_route_cache)
        if outcome.body is not None:
            sets.append(("content-length", str(len(outcome.body))))
            common.body_mutation.body = outcome.body
        common.header_mutation.CopyFrom(header_mutation(sets, outcome.remove_headers))
        resp = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
        if outcome.metadata:
            resp.dynamic_metadata.CopyFrom(dynamic_metadata(outcome.metadata))
        return [resp]

    def _decide(self, body: bytes | None) -> Outcome:
        self._decided = True
        return self.exchange.decide(self._headers, body, self._metadata)

    def _headers_reply(self, outcome: Outcome) -> pb.ProcessingResponse:
        sets = outcome.set_headers
        if outcome.body is not None and self.req_mode != BodyMode.FULL_DUPLEX_STREAMED:
            sets = [*sets, ("content-length", str(len(outcome.body)))]
        common = pb.CommonResponse(
            header_mutation=header_mutation(sets, outcome.remove_headers),
            clear_route_cache=outcome.clear_route_cache,
        )
        resp = pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common))
        if outcome.metadata:
            resp.dynamic_metadata.CopyFrom(dynamic_metadata(outcome.metadata))
        return resp

    def _reject(self, outcome: Outcome) -> pb.ProcessingResponse:
        self.finished = True
        return immediate(outcome.reject_status, outcome.reject_body, outcome.reject_headers)

    def _reject_too_large(self) -> pb.ProcessingResponse:
        self.finished = True
        self._decided = True
        return immediate(
            413,
            f"inference error: PayloadTooLarge - request body exceeds the {self.max_body_bytes}-byte limit",
        )

    # ---- response path -------------------------------------------------------------------------------------------
    def _on_response_headers(self, req: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        headers = read_headers(req.response_headers)
        sets = self.exchange.response_headers(headers, read_metadata(req))
        if sets:
            common = pb.CommonResponse(header_mutation=header_mutation(sets, []))
            return [pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=common))]
        return [pb.ProcessingResponse(response_headers=pb.HeadersResponse())]

    def _on_response_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        data = self.exchange.response_body(body.body, body.end_of_stream)
        if self.resp_mode == BodyMode.FULL_DUPLEX_STREAMED:
            return streamed_chunks(data, body.end_of_stream, request=False)
        if data is body.body or data == body.body:
            return [_EMPTY_RESP_BODY]
        common = pb.CommonResponse(body_mutation=pb.BodyMutation(body=data))
        if self.resp_mode in (BodyMode.BUFFERED, BodyMode.BUFFERED_PARTIAL):
            # Envoy checks content-length against a mutated buffered body.
            common.header_mutation.CopyFrom(header_mutation([("content-length", str(len(data)))], []))
        return [pb.ProcessingResponse(response_body=pb.BodyResponse(response=common))]
