"""W3C Trace Context (`traceparent`, `tracestate`): parsing as the spec says, with no SDK import.

    traceparent: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>     (lowercase hex; bit 0 of flags: sampled)

A header with a bad version (`ff`, non-hex), an all-zero trace or parent id, or the wrong shape is ignored, and
so is its `tracestate` (which never counts without a valid `traceparent`). A future version may append fields
after the flags (`-...`); version 00 may not. `tracestate` is kept as given, cut to its first 32 list members
and 512 characters (`cut_tracestate`), so what a sampled request carries into its spans is bounded.

Where Pointsman finds the trace context of a request (epp/observe/tracing.py): first in the ext_proc stream's gRPC
metadata (Envoy's ext_proc filter writes the context of its own egress span there when Envoy traces), then in the
request's own headers (a client's `traceparent`, which Envoy passes on in `request_headers`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

# version - trace id - parent id - flags [- what a later version appends], lowercase hex. One C-level match
# validates the shape (the ids' values and the versions are checked after it).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.DOTALL)
MAX_TRACESTATE_MEMBERS = 32
MAX_TRACESTATE_CHARS = 512  # what is kept of a longer tracestate (the least a vendor must propagate)
MAX_TRACESTATE_MEMBER_CHARS = 128  # past MAX_TRACESTATE_CHARS, longer members go first


class TraceParent(NamedTuple):
    trace_id: int
    span_id: int
    flags: int
    tracestate: str  # "" when absent

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)


UNSAMPLED = TraceParent(0, 0, 0, "")  # `find_parent`'s answer, when asked, for a valid parent not sampled
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def _valid(value: str) -> re.Match[str] | None:
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace, parent, _flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None) or trace == _ZERO_TRACE or parent == _ZERO_SPAN:
        return None
    return m


def _parent(m: re.Match[str], tracestate: str | None) -> TraceParent:
    return TraceParent(int(m.group(2), 16), int(m.group(3), 16), int(m.group(4), 16),
                       cut_tracestate(tracestate) if tracestate else "")


def parse_traceparent(value: str | None, tracestate: str | None = None) -> TraceParent | None:
    """The parsed header, or None when it is absent or invalid (then `tracestate` is dropped too)."""
    m = _valid(value) if value else None
    return _parent(m, tracestate) if m is not None else None


def cut_tracestate(value: str) -> str:
    """`tracestate` within the spec's limits: at most 32 members and, past 512 characters, members longer than 128
    dropped first, then members from the end (W3C Trace Context, "tracestate limits")."""
    members = [m.strip() for m in value.split(",") if m.strip()][:MAX_TRACESTATE_MEMBERS]
    state = ",".join(members)
    if len(state) <= MAX_TRACESTATE_CHARS:
        return state
    members = [m for m in members if len(m) <= MAX_TRACESTATE_MEMBER_CHARS]
    while members and len(",".join(members)) > MAX_TRACESTATE_CHARS:
        members.pop()
    return ",".join(members)


def trace_id_of(value: str | None) -> str:
    """The trace id of a `traceparent` header as 32 hex digits, or "" when it is absent or invalid."""
    tp = parse_traceparent(value)
    return f"{tp.trace_id:032x}" if tp is not None else ""


def from_metadata(metadata: Sequence[tuple[Any, Any]] | None) -> TraceParent | None:
    """The trace context in gRPC metadata: (str, str) pairs as grpc.aio reports them, or the h2 transport's raw
    (bytes, bytes) header list."""
    return find_parent(metadata, {})[0]


def from_headers(headers: Mapping[str, str]) -> TraceParent | None:
    """The trace context a client sent with the request (lower-cased header names)."""
    return find_parent(None, headers)[0]


def find_parent(metadata: Sequence[tuple[Any, Any]] | None, headers: Mapping[str, str], *,
                sampled_only: bool = False) -> tuple[TraceParent | None, str]:
    """A request's parent and where it came from: the stream metadata's valid `traceparent` ("envoy"), else the
    request headers' ("client"), else (None, ""). `sampled_only`: a valid parent whose sampled flag is off is
    answered as UNSAMPLED, its ids and `tracestate` left unparsed (a ParentBased sampler needs no more)."""
    value = state = None
    for k, v in metadata or ():
        if isinstance(k, bytes):
            if k == b"traceparent":
                value = v.decode("latin-1")
            elif k == b"tracestate":
                state = v.decode("latin-1")
        elif k == "traceparent":
            value = v
        elif k == "tracestate":
            state = v
    m = _valid(value) if value else None
    source = "envoy"
    if m is None:
        value, source = headers.get("traceparent"), "client"
        m = _valid(value) if value else None
        if m is None:
            return None, ""
        state = headers.get("tracestate")
    if sampled_only and not int(m.group(4), 16) & 1:
        return UNSAMPLED, source
    return _parent(m, state), source


def format_traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"
