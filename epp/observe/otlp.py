"""OTLP export through the OpenTelemetry SDK's exporters, with a faster span encoder (imported with tracing only).

The SDK's OTLP exporters (`opentelemetry-exporter-otlp-proto-grpc` and `-http`, the `[otel]` extra) send the
spans: their endpoints, headers, TLS, compression, timeouts and retries follow the standard `OTEL_EXPORTER_OTLP_*`
environment variables. What they do slowly is turn spans into protobuf: the stock encoder builds every nested
message through keyword constructors, which upb copies, about 35 µs per span of Pointsman's shape, spent in the
batch thread while it holds the GIL, so on the event loop's time.

Pointsman's own trace records (epp/observe/tracing.py `record`, one per sampled request, in a wire.py `Records`) take the short way:
epp/observe/wire.py writes them to the request's bytes directly, and the gRPC exporter's stub sends those bytes as
they are (a stub without a request serializer, in the exporter's `_stub` / `_client`; an SDK that keeps them
elsewhere gets the bytes parsed back into the request message). The SDK's own spans, should anything hand them
over, still go through `encode_message`, which fills the `ExportTraceServiceRequest` in place, about four times
faster than the stock encoder (bench/bench_tracing_encode.py compares them; tests/observe/test_otlp_encode.py
checks both give the same message); spans it does not expect (events, links, several resources or scopes) go to
the stock encoder. The exporters take both through their own hooks: the gRPC exporter's `_translate_data`, the
HTTP exporter's module-level `encode_spans` (`encode`).

`xds-protos` (a Pointsman dependency) ships an old copy of the `opentelemetry.proto` modules that overwrites
`opentelemetry-proto`'s when it is installed second; the exporters then fail to import. `check_proto()` names the
fix (scripts/bootstrap.sh applies it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger("epp.tracing")

PROTOCOLS = ("grpc", "http/protobuf")
REPAIR = "pip install --force-reinstall --no-deps opentelemetry-proto"


class TracingUnavailable(RuntimeError):
    """Tracing was asked for and cannot run: the extra is missing or broken."""


def check_proto() -> None:
    try:
        from opentelemetry.proto.common.v1 import common_pb2
    except ImportError as e:
        raise TracingUnavailable(f"--tracing needs the OpenTelemetry SDK: pip install 'pointsman[otel]' ({e})") from e
    if not hasattr(common_pb2, "InstrumentationScope"):
        raise TracingUnavailable(
            "the opentelemetry.proto modules are an old copy (xds-protos ships one that overwrites "
            f"opentelemetry-proto's); repair them with: {REPAIR}")


def _set_value(value: Any, v: object) -> None:
    """One attribute value into an AnyValue, in place."""
    t = type(v)
    if t is str:
        value.string_value = v
    elif t is bool:
        value.bool_value = v
    elif t is int:
        value.int_value = v
    elif t is float:
        value.double_value = v
    elif isinstance(v, (list, tuple)):
        add = value.array_value.values.add
        for item in v:
            _set_value(add(), item)
    elif isinstance(v, bytes):
        value.bytes_value = v
    else:
        value.string_value = str(v)


def fill_attributes(target: Any, attributes: Mapping[str, object] | None) -> None:
    if not attributes:
        return
    add = target.add
    for k, v in attributes.items():
        kv = add()
        kv.key = k
        t = type(v)  # the common scalar types inline; the rest through _set_value
        if t is str:
            kv.value.string_value = v
        elif t is float:
            kv.value.double_value = v
        elif t is int:
            kv.value.int_value = v
        else:
            _set_value(kv.value, v)


class Encoded:
    """Trace records already encoded (epp/observe/wire.py), in the shape the HTTP exporter serializes."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializePartialToString(self) -> bytes:  # noqa: N802 (the protobuf method the exporter calls)
        return self.data

    SerializeToString = SerializePartialToString


_ENCODER: Any = None


def _records(spans: Sequence[Any]) -> bool:
    return getattr(spans, "otlp_records", False)


def encode(spans: Sequence[Any]) -> Any:
    """The ExportTraceServiceRequest for `spans` (ReadableSpans), built in place; for a batch of Pointsman's
    trace records (epp/observe/wire.py `Records`), their bytes as an `Encoded`."""
    global _ENCODER
    if _records(spans):
        if _ENCODER is None:
            from epp.observe.wire import Encoder

            _ENCODER = Encoder()
        return Encoded(_ENCODER.encode(spans))
    return encode_message(spans)


def encode_message(spans: Sequence[Any]) -> Any:
    """The ExportTraceServiceRequest for `spans` (ReadableSpans), built in place."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    if not spans:
        return ExportTraceServiceRequest()
    first = spans[0]
    resource, scope = first.resource, first.instrumentation_scope
    if any(s.resource is not resource or s.instrumentation_scope is not scope or s.events or s.links
           for s in spans):
        return encode_spans(spans)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    fill_attributes(rs.resource.attributes, resource.attributes)
    if resource.schema_url:
        rs.schema_url = resource.schema_url
    ss = rs.scope_spans.add()
    if scope is not None:
        ss.scope.name = scope.name
        if scope.version:
            ss.scope.version = scope.version
        if scope.schema_url:
            ss.schema_url = scope.schema_url
    add = ss.spans.add
    for s in spans:
        p = add()
        c = s.context
        p.trace_id = c.trace_id.to_bytes(16, "big")
        p.span_id = c.span_id.to_bytes(8, "big")
        if c.trace_state:
            p.trace_state = c.trace_state.to_header()
        parent = s.parent
        flags = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
        if parent is not None:
            p.parent_span_id = parent.span_id.to_bytes(8, "big")
            if parent.is_remote:
                flags |= 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
        p.flags = flags
        p.name = s.name
        p.kind = s.kind.value + 1  # SDK INTERNAL=0 .. CONSUMER=4; OTLP 0 is UNSPECIFIED
        p.start_time_unix_nano = s.start_time
        p.end_time_unix_nano = s.end_time
        fill_attributes(p.attributes, s.attributes)
        status = s.status
        p.status.SetInParent()  # present even when unset, as the stock encoder sends it
        if status.status_code.value:
            p.status.code = status.status_code.value
            if status.description:
                p.status.message = status.description
    return req


def exporter(protocol: str, endpoint: str | None) -> Any:
    """The SDK's OTLP span exporter for `protocol` ("grpc" or "http/protobuf"), using `encode`. `endpoint`
    None: the exporter reads OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT itself."""
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

            return _grpc_exporter(Grpc, endpoint)
        if protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http import trace_exporter as http

            if hasattr(http, "encode_spans"):
                http.encode_spans = encode  # the module's own encoding hook
            return http.OTLPSpanExporter(endpoint=endpoint)
    except ImportError as e:
        check_proto()
        raise TracingUnavailable(f"--tracing needs the OpenTelemetry SDK's OTLP exporters: pip install "
                                 f"'pointsman[otel]' ({e})") from e
    raise ValueError(f"unknown OTLP protocol {protocol!r}; expected one of {PROTOCOLS}")


SERVICE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _RawStub:
    """TraceService/Export taking the request's bytes as they are (our encoder has serialized it)."""

    def __init__(self, channel: Any) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        self.Export = channel.unary_unary(SERVICE_EXPORT, request_serializer=None,  # noqa: N815 (the stub's name)
                                          response_deserializer=ExportTraceServiceResponse.FromString)


def _grpc_exporter(base: type, endpoint: str | None) -> Any:
    """The gRPC exporter with our encoder as its translation hook. When the exporter keeps its stub where this
    SDK does (`_stub`, `_channel`, `_client`), the stub sends our bytes as they are; else they are parsed back
    into the request message the stock stub serializes."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from epp.observe.wire import Encoder, span_count

    class FastGrpc(base):  # type: ignore[misc]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._encoder = Encoder()
            self._raw = all(hasattr(self, a) for a in ("_stub", "_channel", "_client"))
            if self._raw:
                self._stub = _RawStub  # the exporter re-creates its stub from this when it reconnects
                self._client = _RawStub(self._channel)

        def _translate_data(self, data: Sequence[Any]) -> Any:
            if _records(data):
                raw = self._encoder.encode(data)  # type: ignore[arg-type]
                return raw if self._raw else ExportTraceServiceRequest.FromString(raw)
            message = encode_message(data)
            return message.SerializeToString() if self._raw else message

        def _count_data(self, data: Sequence[Any]) -> int:
            return span_count(data) if _records(data) else len(data)

    return FastGrpc(endpoint=endpoint)
