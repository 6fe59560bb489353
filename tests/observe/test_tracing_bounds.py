"""What tracing costs and what it never does: an unsampled request makes no span and exports nothing, a sampled
one exports its spans, the export queue is bounded with its drops counted, and a collector that hangs never holds
a stream. Pointsman in-process, a raw ext_proc client playing Envoy, real OTLP receivers (and a hung TCP one)."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import generate_latest

from epp.cmd.app import App
from tests.observe.test_tracing_otlp import by_name, request
from tests.support.backend import EchoFleet
from tests.support.envoy import free_port
from tests.support.otlp import GrpcReceiver
from tests.support.stack import serve_args

UNSAMPLED_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
SAMPLED_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
async def fleet(tmp_path):
    """Two echo servers on loopback (the pool's endpoints: they answer the metrics scrapes)."""
    f = EchoFleet([free_port(), free_port()])
    await f.start()
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: pool\n  endpoints:\n"
                   + "".join(f"  - {{address: 127.0.0.1, port: {p}, models: [llama]}}\n" for p in f.ports))
    try:
        yield eps
    finally:
        await f.stop()


async def serve(eps, *flags: str) -> App:
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps), *flags))
    await app.start()
    return app


async def flush(app) -> None:
    await asyncio.to_thread(app.director.tracing.processor.force_flush)


def metric(app, line: str) -> float:
    text = generate_latest(app.metrics.registry).decode()
    found = [row for row in text.splitlines() if row.startswith(line + " ")]
    assert found, f"{line} not in /metrics"
    return float(found[0].rsplit(" ", 1)[1])


async def test_unsampled_requests_make_no_span_and_export_nothing(fleet):
    """Ratio 1 with an unsampled parent (ParentBased: never followed), in the stream metadata and in the client's
    headers, and ratio 0 for new traces: no trace, nothing queued, nothing on the receiver; the same process
    then exports a sampled parent's request, so the receiver was listening."""
    rx = GrpcReceiver()
    await rx.start()
    app = await serve(fleet, "--tracing", "--tracing-endpoint", rx.endpoint, "--tracing-sample-ratio", "1")
    ratio0 = await serve(fleet, "--tracing", "--tracing-endpoint", rx.endpoint, "--tracing-sample-ratio", "0")
    try:
        for _ in range(5):
            await request(app.port, metadata=(("traceparent", UNSAMPLED_PARENT),))
            await request(app.port, traceparent=UNSAMPLED_PARENT)
            await request(ratio0.port)
        for a in (app, ratio0):
            await flush(a)
            p = a.director.tracing.processor
            assert (p.exported, p.queued, p.dropped) == (0, 0, 0)
        await asyncio.sleep(0.2)
        assert rx.requests == 0 and rx.spans == []
        assert metric(app, 'pointsman_tracing_spans_total{outcome="exported"}') == 0
        await request(app.port, metadata=(("traceparent", SAMPLED_PARENT),))
        spans = await rx.wait_for(lambda s: by_name(s, "pointsman.request"))
    finally:
        await app.stop(0)
        await ratio0.stop(0)
        await rx.stop()
    (root,) = by_name(spans, "pointsman.request")
    assert root.trace_id == SAMPLED_PARENT.split("-")[1]
    assert {s.trace_id for s in spans} == {root.trace_id}
    assert metric(app, 'pointsman_tracing_spans_total{outcome="exported"}') == len(spans)


async def test_a_sampled_request_exports_a_bounded_set_of_spans(fleet):
    """Every sampled request: one request span and its stage spans (at most one per stage), with a bounded
    number of attributes."""
    rx = GrpcReceiver()
    await rx.start()
    app = await serve(fleet, "--tracing", "--tracing-endpoint", rx.endpoint, "--tracing-sample-ratio", "1")
    try:
        for _ in range(10):
            await request(app.port)
        spans = await rx.wait_for(lambda s: len(by_name(s, "pointsman.request")) == 10)
    finally:
        await app.stop(0)
        await rx.stop()
    by_trace: dict[str, list] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    assert len(by_trace) == 10
    for trace in by_trace.values():
        names = [s.name for s in trace]
        assert names.count("pointsman.request") == 1 and len(names) == len(set(names)) <= 5
        assert sorted(names) == ["pointsman.request", "pointsman.schedule"]
        assert len(by_name(trace, "pointsman.request")[0].span.attributes) <= 40


class HungCollector:
    """A TCP listener that accepts connections and never answers (an OTLP collector that hangs)."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.connections: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections.append(writer)  # read nothing, answer nothing, close nothing

        self.server = await asyncio.start_server(hold, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        for w in self.connections:
            w.close()
        if self.server is not None:
            self.server.close()


@pytest.mark.realtime
async def test_a_hung_collector_never_holds_a_stream_and_the_queue_drops_counted(fleet, monkeypatch):
    """Every request sampled, the collector accepts and never answers: the export thread waits on it, the queue
    (8 spans) fills and drops the oldest traces, counted; every stream still ends as fast as without tracing, and
    stopping does not wait for the collector."""
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "8")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_EXPORT_TIMEOUT", "500")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")
    hung = HungCollector()
    endpoint = await hung.start()
    app = await serve(fleet, "--tracing", "--tracing-endpoint", endpoint, "--tracing-sample-ratio", "1")
    try:
        slowest = 0.0
        for _ in range(40):
            t0 = time.monotonic()
            await asyncio.wait_for(request(app.port), 10)
            slowest = max(slowest, time.monotonic() - t0)
        p = app.director.tracing.processor
        assert p.queued <= 8
        assert p.dropped >= 40 * 2 - 8 - p.exported  # two spans a request: what was not exported or queued
        assert p.dropped > 0
        assert metric(app, 'pointsman_tracing_spans_total{outcome="dropped"}') == p.dropped
        assert slowest < 2.0
    finally:
        t0 = time.monotonic()
        await app.stop(0)
        stopped = time.monotonic() - t0
        await hung.stop()
    assert stopped < 10.0


async def test_routing_decisions_are_the_same_with_tracing_on(fleet):
    """The same seed and the same requests: the same picks, tracing off, unsampled or sampled (tracing draws
    from its own source, never the scheduler's)."""
    rx = GrpcReceiver()
    await rx.start()
    apps = [await serve(fleet), await serve(fleet, "--tracing", "--tracing-endpoint", rx.endpoint,
                                            "--tracing-sample-ratio", "0"),
            await serve(fleet, "--tracing", "--tracing-endpoint", rx.endpoint, "--tracing-sample-ratio", "1")]
    try:
        picks = [[await request(a.port, **{"x-request-id": f"r{i}"}) for i in range(12)] for a in apps]
        await rx.wait_for(lambda s: len(by_name(s, "pointsman.request")) == 12)
    finally:
        for a in apps:
            await a.stop(0)
        await rx.stop()
    assert picks[0] == picks[1] == picks[2]
    assert len(set(picks[0])) == 2  # both endpoints were picked: the decisions had something to decide
