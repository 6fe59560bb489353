"""OTLP export through the OpenTelemetry SDK's exporters, with Pointsman's encoder (imported with tracing only).

The SDK's OTLP exporters (`opentelemetry-exporter-otlp-proto-grpc` and `-http`, the `[otel]` extra) send the
spans: their endpoints, headers, TLS, compression, timeouts and retries follow the standard `OTEL_EXPORTER_OTLP_*`
environment variables. What they do slowly is turn spans into protobuf (the stock encoder builds every nested
message through keyword constructors, which upb copies), in the batch thread while it holds the GIL, so on the
event loop's time.

Pointsman's traces do not go that way: epp/observe/wire.py, the one OTLP encoder, has written each of them as
bytes when its request finished, and a batch of them (a wire.py `Batch`) becomes the request's bytes by framing
alone. The gRPC exporter's stub sends those bytes as they are (a stub without a request serializer, in the
exporter's `_stub` / `_client`; an SDK that keeps them elsewhere gets the bytes parsed back into the request
message). The exporters take them through their own hooks: the gRPC exporter's `_translate_data`, the HTTP
exporter's module-level `encode_spans` (`encode`). Anything else handed to them (the SDK's own spans; Pointsman
makes none) goes to the SDK's stock encoder.

`xds-protos` (a Pointsman dependency) ships an old copy of the `opentelemetry.proto` modules that overwrites
`opentelemetry-proto`'s when it is installed second; the exporters then fail to import. `check_proto()` names the
fix (scripts/bootstrap.sh applies it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from epp.observe.wire import Batch

if TYPE_CHECKING:
    import grpc

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


class Encoded:
    """Traces already encoded (epp/observe/wire.py), in the shape the HTTP exporter serializes."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializePartialToString(self) -> bytes:  # noqa: N802 (the protobuf method the exporter calls)
        return self.data

    SerializeToString = SerializePartialToString


def encode(spans: Sequence[Any]) -> Any:
    """The HTTP exporter's encoding hook: a batch of Pointsman's encoded traces (epp/observe/wire.py `Batch`) as
    the request's bytes (an `Encoded`); anything else through the SDK's stock encoder."""
    if isinstance(spans, Batch):
        return Encoded(spans.request())
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(spans)


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

    def __init__(self, channel: grpc.Channel) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        self.Export = channel.unary_unary(SERVICE_EXPORT, request_serializer=None,  # noqa: N815 (the stub's name)
                                          response_deserializer=ExportTraceServiceResponse.FromString)


def _grpc_exporter(base: type, endpoint: str | None) -> Any:
    """The gRPC exporter taking our encoded batches in its translation hook. When the exporter keeps its stub
    where this SDK does (`_stub`, `_channel`, `_client`), the stub sends our bytes as they are; else they are
    parsed back into the request message the stock stub serializes."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    class FastGrpc(base):  # type: ignore[misc]
        def __init__(self, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self._raw = all(hasattr(self, a) for a in ("_stub", "_channel", "_client"))
            if self._raw:
                self._stub = _RawStub  # the exporter re-creates its stub from this when it reconnects
                self._client = _RawStub(self._channel)

        def _translate_data(self, data: Sequence[Any]) -> Any:
            if isinstance(data, Batch):
                raw = data.request()
                return raw if self._raw else ExportTraceServiceRequest.FromString(raw)
            message = super()._translate_data(data)  # the SDK's stock encoder
            return message.SerializeToString() if self._raw else message

        def _count_data(self, data: Sequence[Any]) -> int:
            return data.spans if isinstance(data, Batch) else len(data)

    return FastGrpc(endpoint=endpoint)
