"""The in-place OTLP encoder gives the same ExportTraceServiceRequest as the SDK's own encoder."""

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from epp.observe.otlp import encode


def spans():
    resource = Resource.create({"service.name": "t", "n": 3, "f": 1.5, "b": True, "l": ["x", "y"]})
    scope = InstrumentationScope("pointsman", "1.0")
    state = TraceState.from_header(["v=1"])
    parent = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True, TraceFlags(1), state)
    root = SpanContext(parent.trace_id, 0x1234, False, TraceFlags(1), state)
    child = SpanContext(parent.trace_id, 0x5678, False, TraceFlags(1), state)
    return [
        ReadableSpan("pointsman.request", root, parent, resource, {"s": "v", "i": 7, "d": 0.25, "b": False},
                     kind=SpanKind.SERVER, status=Status(StatusCode.ERROR, "BadRequest"), start_time=10,
                     end_time=20, instrumentation_scope=scope),
        ReadableSpan("pointsman.schedule", child, root, resource, None, kind=SpanKind.INTERNAL, start_time=12,
                     end_time=15, instrumentation_scope=scope),
        ReadableSpan("no parent", SpanContext(1, 2, False, TraceFlags(1)), None, resource, {"x": "y"},
                     kind=SpanKind.CLIENT, start_time=1, end_time=2, instrumentation_scope=scope),
    ]


def test_same_message_as_the_sdk_encoder():
    batch = spans()
    ours, theirs = encode(batch), encode_spans(batch)
    assert ours == theirs, f"{ours}\n---\n{theirs}"
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)


def test_spans_it_does_not_expect_go_to_the_sdk_encoder():
    mixed = spans()
    mixed[1]._resource = Resource.create({"service.name": "other"})
    assert encode(mixed) == encode_spans(mixed)
