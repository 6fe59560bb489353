"""Pointsman's OTLP encoder: its trace records straight to OTLP protobuf bytes (imported with tracing only).

A sampled request's trace is a record when its stream ends (epp/observe/tracing.py `record`, a plain tuple): its
ids, times, status, the request span's attributes and the stage spans. `Encoder.trace` writes it at once, on the
event loop, as its spans' bytes (ScopeSpans.spans fields); the export queue holds those bytes, and a `Batch` of them
becomes an `ExportTraceServiceRequest` (opentelemetry/proto/collector/trace/v1/trace_service.proto) by framing
alone. Nothing is built per field: the resource and the instrumentation scope are serialized once per `Origin`,
the fields every span shares (names, kinds, flags, an empty status) are constants, and an attribute whose string
value repeats (the pool, the model, the pick...) is encoded once and then looked up. What it writes is what the
SDK's encoder writes for the same spans (tests/observe/test_trace_batching.py parses both and compares).

Why on the loop: encoding a trace costs about 7 µs wherever it runs, but in the export thread it also cost the
loop the GIL's hand-overs to that thread and what they did to its caches. Measured through Envoy at 100% sampling,
tracing took 16 to 29% more processor CPU per request with the encoding in the thread and 11 to 18% with it on the
loop (docs/observability.md, "Performance").

Wire format reminders: a field is a varint key `(number << 3) | wire type` (0 varint, 1 fixed64, 2 length-delimited,
5 fixed32); proto3 scalars at their zero value are left out, except inside a oneof (AnyValue's members).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

_Q = struct.Struct("<Q").pack  # fixed64
_D = struct.Struct("<d").pack  # double
_I = struct.Struct("<I").pack  # fixed32
_SMALL = [bytes((n,)) for n in range(128)]
MASK64 = (1 << 64) - 1
MAX_CACHED = 4096  # encoded attributes (key, string value) kept; cleared past this
UNIQUE_KEYS = frozenset({"pointsman.decision_id", "pointsman.request_id"})  # never repeat: not cached

SPAN_FLAGS = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
REMOTE_PARENT = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
KIND_INTERNAL, KIND_SERVER = 1, 2  # OTLP's SpanKind (0 is UNSPECIFIED)
_FLAGS = b"\x85\x01" + _I(SPAN_FLAGS)  # Span.flags (16, fixed32)
_FLAGS_REMOTE_PARENT = b"\x85\x01" + _I(SPAN_FLAGS | REMOTE_PARENT)
_NO_STATUS = b"\x7a\x00"  # Span.status (15), empty: UNSET, present as the SDK's encoder sends it
_CHILD_TAIL = _NO_STATUS + _FLAGS


def varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _any_value(v: object) -> bytes:
    """An AnyValue message's bytes."""
    if type(v) is str:
        return field(1, v.encode())
    t = type(v)
    if t is bool:
        return b"\x10\x01" if v else b"\x10\x00"
    if type(v) is int:
        return b"\x18" + varint(v & MASK64)
    if t is float:
        return b"\x21" + _D(v)
    if isinstance(v, (list, tuple)):
        return field(5, b"".join(field(1, _any_value(item)) for item in v))
    if isinstance(v, bytes):
        return field(7, v)
    return field(1, str(v).encode())


class Origin:
    """Where a batch's spans come from: the resource and the instrumentation scope, serialized once."""

    __slots__ = ("prefix_resource", "prefix_scope", "suffix_resource", "suffix_scope")

    def __init__(self, resource: Resource, scope: InstrumentationScope | None) -> None:
        # Resource { attributes (1): KeyValue { key (1), value (2) } }; InstrumentationScope { name (1), version (2) }
        attrs = b"".join(field(1, field(1, k.encode()) + field(2, _any_value(v)))
                         for k, v in (resource.attributes or {}).items())
        name = field(1, scope.name.encode()) if scope is not None and scope.name else b""
        version = field(2, scope.version.encode()) if scope is not None and scope.version else b""
        self.prefix_resource = field(1, attrs)  # ResourceSpans.resource
        self.suffix_resource = field(3, resource.schema_url.encode()) if resource.schema_url else b""
        self.prefix_scope = field(1, name + version)  # ScopeSpans.scope
        self.suffix_scope = field(3, scope.schema_url.encode()) if scope is not None and scope.schema_url else b""

    def request(self, spans: Iterable[bytes]) -> bytes:
        """ResourceSpans { resource, ScopeSpans { scope, spans } }, as ExportTraceServiceRequest field 1."""
        scope_spans = self.prefix_scope + b"".join(spans) + self.suffix_scope
        return field(1, self.prefix_resource + field(2, scope_spans) + self.suffix_resource)


class Encoder:
    """Encodes trace records, one at a time as each request finishes; keeps the encoded attribute keys and
    repeated (key, value) pairs. Owned by the event loop (the tracer's `finish`), so the caches need no lock.
    `new_span_id` draws the stage spans' ids; `root_name` is the request span's name."""

    def __init__(self, new_span_id: Callable[[], int], root_name: str) -> None:
        self.new_span_id, self.root_name = new_span_id, root_name
        self._keys: dict[str, bytes] = {}
        self._strings: dict[tuple[str, str], bytes] = {}
        self._ints: dict[tuple[str, int], bytes] = {}
        self._floats: dict[str, bytes] = {}
        self._names: dict[tuple[str, int], bytes] = {}

    def attributes(self, attributes: Iterable[tuple[str, object]]) -> list[bytes]:
        """Span.attributes (field 9) of each attribute: a repeated string or integer value is looked up whole,
        a float's field is a constant prefix and its 8 bytes."""
        out: list[bytes] = []
        append = out.append
        strings, ints, floats = self._strings, self._ints, self._floats
        for k, v in attributes:
            if type(v) is str:
                if k in UNIQUE_KEYS:
                    vb = v.encode()
                    n = len(vb)
                    if n < 126:  # AnyValue and its length fit a byte each
                        body = self._key(k) + b"\x12" + _SMALL[n + 2] + b"\x0a" + _SMALL[n] + vb
                        append(b"\x4a" + varint(len(body)) + body)
                    else:
                        append(self._pair(k, v))
                    continue
                kv = strings.get((k, v))
                if kv is None:
                    if len(strings) >= MAX_CACHED:
                        strings.clear()
                    kv = strings[(k, v)] = self._pair(k, v)
                append(kv)
            elif type(v) is float:
                prefix = floats.get(k)
                if prefix is None:
                    key = self._key(k)
                    prefix = floats[k] = b"\x4a" + varint(len(key) + 11) + key + b"\x12\x09\x21"
                append(prefix + _D(v))
            elif type(v) is int:
                kv = ints.get((k, v))
                if kv is None:
                    if len(ints) >= MAX_CACHED:
                        ints.clear()
                    kv = ints[(k, v)] = self._pair(k, v)
                append(kv)
            else:
                append(self._pair(k, v))
        return out

    def _key(self, k: str) -> bytes:
        key = self._keys.get(k)
        if key is None:
            if len(self._keys) >= MAX_CACHED:
                self._keys.clear()
            key = self._keys[k] = field(1, k.encode())
        return key

    def _pair(self, k: str, v: object) -> bytes:
        return field(9, self._key(k) + field(2, _any_value(v)))

    def name(self, name: str, kind: int) -> bytes:
        """Span.name (5) and Span.kind (6)."""
        out = self._names.get((name, kind))
        if out is None:
            out = self._names[(name, kind)] = field(5, name.encode()) + b"\x30" + varint(kind)
        return out

    def trace(self, r: tuple[Any, ...]) -> bytes:
        """The spans of one record (epp/observe/tracing.py `record`): the request span, then its children, each a
        ScopeSpans.spans field, as one string of bytes."""
        trace_id, span_id, parent_id, state, wall, start, end, error, status, keys, values, children = r
        tid = b"\x0a\x10" + trace_id.to_bytes(16, "big")
        state_field = field(3, state.encode()) if state else b""
        sid = span_id.to_bytes(8, "big")
        if parent_id:
            parent = b"\x22\x08" + parent_id.to_bytes(8, "big")
            flags = _FLAGS_REMOTE_PARENT
        else:
            parent, flags = b"", _FLAGS
        if error or status >= 500:
            status_field = field(15, field(2, error.encode()) + b"\x18\x02" if error else b"\x18\x02")
        else:
            status_field = _NO_STATUS
        parts = [tid, b"\x12\x08", sid, state_field, parent, self.name(self.root_name, KIND_SERVER),
                 b"\x39" + _Q(wall + start), b"\x41" + _Q(wall + end)]
        parts += self.attributes(zip(keys, values, strict=True))
        parts.append(status_field)
        parts.append(flags)
        body = b"".join(parts)
        out = [b"\x12", varint(len(body)), body]
        child_parent = b"\x22\x08" + sid
        name, new_id = self.name, self.new_span_id
        for child, begin, stop in children:
            body = b"".join((tid, b"\x12\x08", new_id().to_bytes(8, "big"), state_field, child_parent,
                             name(child, KIND_INTERNAL), b"\x39", _Q(wall + begin), b"\x41", _Q(wall + stop),
                             _CHILD_TAIL))
            out += (b"\x12", varint(len(body)), body)
        return b"".join(out)

    def request(self, records: Iterable[tuple[Any, ...]], origin: Origin) -> bytes:
        """ExportTraceServiceRequest bytes for records encoded together (tests and benchmarks; tracing encodes
        each record when its request finishes and sends a `Batch`)."""
        records = list(records)
        return Batch([self.trace(r) for r in records], origin, span_count(records)).request()


def span_count(records: Iterable[tuple[Any, ...]]) -> int:
    """The spans of trace records: each request span and its children (the record's last member)."""
    return sum(1 + len(r[-1]) for r in records)


class Batch(list[bytes]):
    """A batch of encoded traces (`Encoder.trace`) as the exporter gets it: their origin and how many spans they
    hold."""

    __slots__ = ("origin", "spans")

    def __init__(self, traces: Iterable[bytes], origin: Origin, spans: int) -> None:
        super().__init__(traces)
        self.origin, self.spans = origin, spans

    def request(self) -> bytes:
        """The batch as ExportTraceServiceRequest bytes (empty for no traces)."""
        return self.origin.request(self) if self else b""
