"""The one OTLP encoder (epp/observe/wire.py): the resource and scope it writes once per origin are the bytes the
SDK's encoder writes for them, whatever the attribute types; the HTTP exporter's hook gives our records' bytes
and hands anything else to the SDK's stock encoder."""

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from epp.observe.otlp import Encoded, encode
from epp.observe.wire import Batch, Encoder, Origin

TRACE, SPAN = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
ODD = {"service.name": "t", "n": 3, "neg": -7, "f": 1.5, "b": True, "off": False, "empty": "", "l": ["x", "y"],
       "nums": [1, 2], "é": "ü" * 200}


def one_span(resource: Resource, scope: InstrumentationScope | None) -> tuple[Batch, list[ReadableSpan]]:
    """One request span without attributes as our encoded batch and as the SDK's span."""
    rec = (TRACE, SPAN, 0, "", 1000, 10, 20, "", 200, (), (), ())
    sdk = ReadableSpan("pointsman.request", SpanContext(TRACE, SPAN, False, TraceFlags(1)), None, resource, None,
                       kind=SpanKind.SERVER, start_time=1010, end_time=1020, instrumentation_scope=scope)
    return Batch([Encoder(lambda: 1, "pointsman.request").trace(rec)], Origin(resource, scope), 1), [sdk]


def test_the_origin_is_written_as_the_sdk_writes_it():
    cases = [
        (Resource.create(ODD), InstrumentationScope("pointsman", "1.0")),
        (Resource({"k": "v"}, schema_url="https://example.com/schema"),
         InstrumentationScope("pointsman", "", schema_url="https://example.com/scope")),
        (Resource({}), InstrumentationScope("", "2.0")),
        (Resource({"only": 1}), None),
    ]
    for resource, scope in cases:
        recs, sdk = one_span(resource, scope)
        ours = ExportTraceServiceRequest.FromString(recs.request())
        theirs = encode_spans(sdk)
        assert ours == theirs, f"{resource.attributes} {scope}\n{ours}\n---\n{theirs}"
        assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)


def test_the_http_hook_encodes_records_and_leaves_other_spans_to_the_sdk():
    recs, sdk = one_span(Resource.create(ODD), InstrumentationScope("pointsman", "1.0"))
    got = encode(recs)
    assert isinstance(got, Encoded) and got.SerializeToString() == recs.request()
    assert encode(sdk) == encode_spans(sdk)
    assert ExportTraceServiceRequest.FromString(got.SerializeToString()) == encode_spans(sdk)


def test_the_grpc_hook_sends_records_as_bytes_and_other_spans_through_the_sdk():
    from epp.observe.otlp import exporter

    recs, sdk = one_span(Resource.create(ODD), InstrumentationScope("pointsman", "1.0"))
    made = exporter("grpc", "http://127.0.0.1:9")
    try:
        ours, theirs = made._translate_data(recs), made._translate_data(sdk)
        as_message = (lambda x: ExportTraceServiceRequest.FromString(x)) if isinstance(ours, bytes) else (lambda x: x)
        assert as_message(ours) == as_message(theirs) == encode_spans(sdk)
        assert made._count_data(recs) == made._count_data(sdk) == 1
    finally:
        made.shutdown()
