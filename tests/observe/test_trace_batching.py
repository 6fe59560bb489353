"""Tracing's own batching and encoding (epp/observe/batching.py, epp/observe/wire.py): the bounded queue drops the
oldest traces when full and never blocks, batches are bounded in spans, a timer and shutdown flush, the OTEL_BSP_*
variables apply; the records' bytes are the message the SDK's encoder makes of the same spans; and a stopping
Pointsman flushes to a real receiver."""

from __future__ import annotations

import gc
import threading
import time

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from epp.observe import TracingSettings
from epp.observe.batching import Batcher, BatchSettings
from epp.observe.tracing import Trace, Tracing, record
from epp.observe.wire import Batch, Encoder, span_count
from epp.request.tracecontext import TraceParent
from tests.observe.test_tracing_otlp import by_name, request, start
from tests.support.otlp import GrpcReceiver
from tests.support.wait import wait_until


class Gated(InMemorySpanExporter):
    """The SDK's in-memory exporter, keeping each batch, that holds an export until `gate` opens."""

    def __init__(self, open_: bool = True) -> None:
        super().__init__()
        self.gate = threading.Event()
        if open_:
            self.gate.set()
        self.entered = threading.Event()
        self.batches: list[list] = []

    def export(self, spans):
        self.entered.set()
        assert self.gate.wait(20), "the test never opened the gate"
        self.batches.append(list(spans))
        return super().export(spans)


def emit(b: Batcher, name: object, spans: int) -> None:
    """Queue a trace (here a name and its span count, kept together so the batches can be read back)."""
    b.emit((name, spans), spans)


def test_a_full_queue_drops_the_oldest_traces_and_never_blocks():
    ex = Gated(open_=False)
    b = Batcher(ex, BatchSettings(max_queue_size=4, max_export_batch_size=4, schedule_delay=3600))
    try:
        for i in range(4):
            emit(b, f"r{i}", 1)
        assert ex.entered.wait(10)  # a full batch woke the thread: it took r0..r3 and waits in the exporter
        t0 = time.monotonic()
        for i in range(4, 10):
            emit(b, f"r{i}", 1)
        assert time.monotonic() - t0 < 1.0  # the held exporter did not hold the emits
        assert b.dropped == 2 and b.queued == 4
        emit(b, "big", 3)  # counted in spans: three more spans push out the three oldest traces
        assert b.dropped == 5 and b.queued == 4
    finally:
        ex.gate.set()
        b.shutdown()
    names = [r[0] for batch in ex.batches for r in batch]
    assert names == ["r0", "r1", "r2", "r3", "r9", "big"]
    emit(b, "late", 1)  # after shutdown: dropped, not exported
    assert b.dropped == 6 and ex._stopped


def test_batches_are_bounded_in_spans_and_all_are_exported():
    ex = Gated()
    b = Batcher(ex, BatchSettings(max_queue_size=1000, max_export_batch_size=5, schedule_delay=3600))
    for i in range(40):
        emit(b, i, 1 + i % 3)
    b.shutdown()
    assert [r[0] for batch in ex.batches for r in batch] == list(range(40))
    assert all(sum(r[1] for r in batch) <= 5 for batch in ex.batches)
    assert b.exported == sum(1 + i % 3 for i in range(40)) and b.dropped == 0


def test_the_timer_flushes_a_partial_batch():
    ex = Gated()
    b = Batcher(ex, BatchSettings(max_queue_size=100, max_export_batch_size=50, schedule_delay=0.05))
    try:
        emit(b, "one", 1)
        wait_until(lambda: len(ex.get_finished_spans()) == 1, 10.0)
    finally:
        b.shutdown()


def test_force_flush_exports_what_is_queued():
    ex = Gated()
    b = Batcher(ex, BatchSettings(max_queue_size=100, max_export_batch_size=50, schedule_delay=3600))
    try:
        emit(b, "a", 1)
        emit(b, "b", 2)
        assert b.force_flush()
        assert [r[0] for r in ex.get_finished_spans()] == ["a", "b"] and b.queued == 0
    finally:
        b.shutdown()
    assert not b.force_flush()


def test_an_exporter_failure_is_logged_and_the_thread_goes_on(caplog):
    class Failing(Gated):
        def export(self, spans):
            if not self.batches:
                self.batches.append([])
                raise RuntimeError("collector exploded")
            return super().export(spans)

    ex = Failing()
    b = Batcher(ex, BatchSettings(max_queue_size=100, max_export_batch_size=1, schedule_delay=3600))
    emit(b, "lost", 1)
    emit(b, "kept", 1)
    b.shutdown()
    assert [r[0] for r in ex.get_finished_spans()] == ["kept"]
    assert "exporting 1 traces failed" in caplog.text
    assert (b.exported, b.failed, b.dropped) == (2, 1, 0)


def test_a_failure_the_exporter_answers_is_counted():
    """The SDK's exporters answer SpanExportResult.FAILURE (a collector that refused, timed out or was away)."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    class Refused(Gated):
        def export(self, spans):
            super().export(spans)
            return SpanExportResult.FAILURE if spans[0][0] == "refused" else SpanExportResult.SUCCESS

    b = Batcher(Refused(), BatchSettings(max_queue_size=100, max_export_batch_size=2, schedule_delay=3600))
    emit(b, "refused", 2)
    emit(b, "taken", 1)
    b.shutdown()
    assert (b.exported, b.failed) == (3, 2)


def test_the_otel_bsp_variables(monkeypatch):
    for name, value in {"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "30",
                        "OTEL_BSP_SCHEDULE_DELAY": "250", "OTEL_BSP_EXPORT_TIMEOUT": "1000"}.items():
        monkeypatch.setenv(name, value)
    assert BatchSettings.from_env() == BatchSettings(100, 30, 0.25, 1.0)
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "500")  # larger than the queue: the queue's size
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "soon")  # not a number: the default
    assert BatchSettings.from_env() == BatchSettings(100, 100, 5.0, 1.0)
    for name in ("OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_BSP_SCHEDULE_DELAY",
                 "OTEL_BSP_EXPORT_TIMEOUT"):
        monkeypatch.delenv(name)
    assert BatchSettings.from_env() == BatchSettings()


# ---- the encoding ------------------------------------------------------------------------------------------------
ATTRS = {"pointsman.decision_id": "d-1", "pointsman.request_id": "r" * 300, "gen_ai.request.model": "llama",
         "pointsman.candidates": 3, "pointsman.margin": 0.125, "big": 1 << 40, "negative": -7, "zero": 0,
         "flag": True, "off": False, "empty": "", "list": ["a", "b"], "raw": b"\x00\x01", "é": "ü" * 200}


def traces(tracing: Tracing) -> list[tuple]:
    """Three finished traces: a new one with two stage spans, a rejection under Envoy's span, a 5xx answer."""
    envoy = TraceParent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1, "envoy=1,other=2")
    plain = Trace(tracing, 0x1234, 0x99, None, None, "")
    p0 = plain.perf0
    rejected = Trace(tracing, envoy.trace_id, 0x77, envoy, tracing._state_cls.from_header([envoy.tracestate]), "envoy")
    failed = Trace(tracing, 0x5678, 0x55, None, None, "")
    failed.status = 503  # an error without a message
    return [record(plain, p0 + 10, p0 + 5000, dict(ATTRS), [("pointsman.schedule", p0 + 20, p0 + 40),
                                                             ("pointsman.queue", p0 + 12, p0 + 19)]),
            record(rejected, rejected.perf0, rejected.perf0 + 3, {"error.type": "BadRequest"}, [], "BadRequest"),
            record(failed, failed.perf0, failed.perf0 + 8, {"x": 1}, [])]


def batch(tracing: Tracing, recs: list[tuple]) -> Batch:
    """The records as tracing queues and exports them: each encoded by the tracer's own encoder."""
    return Batch([tracing.encoder.trace(r) for r in recs], tracing.origin, span_count(recs))


def sdk_spans(tracing: Tracing, recs: list[tuple], child_ids: list[int]) -> list[ReadableSpan]:
    """The same spans as the SDK's ReadableSpans, built as Pointsman built them before its own encoder."""
    out, ids = [], iter(child_ids)
    flags = TraceFlags(TraceFlags.SAMPLED)
    for trace_id, span_id, parent_id, state, wall, begin0, end, error, status, keys, values, children in recs:
        ts = tracing._state_cls.from_header([state]) if state else None
        root = SpanContext(trace_id, span_id, False, flags, ts)
        parent = SpanContext(trace_id, parent_id, True, flags, ts) if parent_id else None
        st = Status(StatusCode.ERROR, error) if error or status >= 500 else Status(StatusCode.UNSET)
        out.append(ReadableSpan(name="pointsman.request", context=root, parent=parent, resource=tracing.resource,
                                attributes=dict(zip(keys, values, strict=True)), kind=SpanKind.SERVER, status=st,
                                start_time=wall + begin0, end_time=wall + end, instrumentation_scope=tracing.scope))
        for name, begin, stop in children:
            ctx = SpanContext(trace_id, next(ids), False, flags, ts)
            out.append(ReadableSpan(name=name, context=ctx, parent=root, resource=tracing.resource, attributes=None,
                                    kind=SpanKind.INTERNAL, start_time=wall + begin, end_time=wall + stop,
                                    instrumentation_scope=tracing.scope))
    return out


def test_the_records_bytes_are_the_sdk_encoders_message():
    tracing = Tracing(TracingSettings(enabled=True, sample_ratio=1.0, service_name="enc-test"),
                      exporter=InMemorySpanExporter())
    try:
        recs = traces(tracing)
        encoder = Encoder(tracing.new_span_id, "pointsman.request")
        for _ in range(2):  # the second time from the encoder's caches
            ours = ExportTraceServiceRequest.FromString(encoder.request(recs, tracing.origin))
            got = ours.resource_spans[0].scope_spans[0].spans
            assert [s.name for s in got] == ["pointsman.request", "pointsman.schedule", "pointsman.queue",
                                             "pointsman.request", "pointsman.request"]
            child_ids = [int.from_bytes(s.span_id, "big") for s in got if s.name != "pointsman.request"]
            theirs = encode_spans(sdk_spans(tracing, recs, child_ids))
            assert ours == theirs, f"{ours}\n---\n{theirs}"
    finally:
        tracing.shutdown()


async def test_a_finished_request_waits_in_the_queue_as_its_encoded_spans(tmp_path, monkeypatch):
    """The loop encodes a trace when its request finishes: the queue holds bytes (nothing for the garbage
    collector to track, nothing left for the export thread to encode), and they are the request's spans."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # nothing leaves on the timer
    rx = GrpcReceiver()
    await rx.start()
    app = await start(tmp_path, "--tracing", "--tracing-endpoint", rx.endpoint, "--tracing-sample-ratio", "1")
    try:
        await request(app.port, **{"x-request-id": "queued-1"})
        tracing = app.director.tracing
        queued = list(tracing.processor._queue)
        assert [n for _, n in queued] == [2]  # the request span and its schedule span
        data = queued[0][0]
        assert type(data) is bytes and not gc.is_tracked(data)
        sent = ExportTraceServiceRequest.FromString(Batch([data], tracing.origin, 2).request())
        got = sent.resource_spans[0].scope_spans[0].spans
        assert [s.name for s in got] == ["pointsman.request", "pointsman.schedule"]
        ids = {a.key: a.value.string_value for a in got[0].attributes}
        assert ids["pointsman.request_id"] == "queued-1"
        assert got[1].parent_span_id == got[0].span_id and got[1].trace_id == got[0].trace_id
    finally:
        await app.stop(0)
        await rx.stop()


# ---- end to end --------------------------------------------------------------------------------------------------
async def test_stopping_flushes_the_queued_spans_to_the_receiver(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # nothing leaves on the timer: only the stop sends
    rx = GrpcReceiver()
    await rx.start()
    app = await start(tmp_path, "--tracing", "--tracing-endpoint", rx.endpoint, "--tracing-sample-ratio", "1")
    try:
        for i in range(3):
            await request(app.port, **{"x-request-id": f"flush-{i}"})
        assert rx.spans == []
    finally:
        await app.stop(0)
    try:
        roots = by_name(rx.spans, "pointsman.request")
        assert sorted(r.attrs()["pointsman.request_id"] for r in roots) == ["flush-0", "flush-1", "flush-2"]
        assert len(by_name(rx.spans, "pointsman.schedule")) == 3
    finally:
        await rx.stop()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_exporters_take_records(protocol):
    """Both hooks: our records become bytes, with the spans counted."""
    from epp.observe.otlp import encode, exporter

    made = exporter(protocol, "http://127.0.0.1:9")
    try:
        tracing = Tracing(TracingSettings(enabled=True, sample_ratio=1.0), exporter=InMemorySpanExporter())
        recs = batch(tracing, traces(tracing))
        if protocol == "grpc":
            raw = made._translate_data(recs)
            assert made._count_data(recs) == 5
        else:
            raw = encode(recs).SerializePartialToString()
        assert len(ExportTraceServiceRequest.FromString(raw).resource_spans[0].scope_spans[0].spans) == 5
        tracing.shutdown()
    finally:
        made.shutdown()
