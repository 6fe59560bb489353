"""OTLP span encoding: the SDK's stock encoder against Pointsman's (epp/observe/wire.py), interleaved.

Each round encodes the same batch of traces shaped like Pointsman's (a request span with a dozen attributes and
its six stage spans): the SDK's encoder from its ReadableSpans, Pointsman's encoder from its trace records (what
the tracer encodes as each request finishes), framed as one request. The table gives the median µs per span of each and their ratio per round, so a
noisy machine moves both sides of a ratio alike; both give the same message (checked before timing).

    .venv/bin/python bench/bench_tracing_encode.py [--spans 511] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags  # noqa: E402

from epp.observe.wire import Encoder, Origin  # noqa: E402

STAGES = ("resolve", "admit", "prepare", "queue", "schedule", "commit")
WALL = 1_700_000_000_000_000_000


def traces(n: int) -> tuple[list[tuple[Any, ...]], Origin, Encoder, list[ReadableSpan]]:
    """`n` spans (a request span and its stage spans per trace) as Pointsman's records (with their origin and an
    encoder) and as SDK spans."""
    resource = Resource.create({"service.name": "pointsman", "service.instance.id": "epp-0"})
    scope = InstrumentationScope("pointsman", "1.0")
    records: list[tuple[Any, ...]] = []
    spans: list[ReadableSpan] = []
    child_ids: list[int] = []
    trace = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    while len(spans) < n:
        trace += 1
        root_id = 0x1000 + len(spans)
        attrs = {"gen_ai.request.model": "llama-3-8b", "pointsman.pool": "pool-a", "pointsman.profile": "default",
                 "pointsman.endpoint": "10.0.0.7:8000", "pointsman.decision_id": f"d-{trace:x}",
                 "http.status": 200, "gen_ai.usage.input_tokens": 1234, "gen_ai.usage.output_tokens": 56,
                 "pointsman.queued": False, "pointsman.candidates": 8, "pointsman.score": 0.875,
                 "pointsman.outcome": "routed"}
        children = tuple((f"pointsman.{stage}", 11 + i, 12 + i) for i, stage in enumerate(STAGES))
        records.append((trace, root_id, 0, "", WALL, 10, 20, "", 200, tuple(attrs), tuple(attrs.values()),
                        children))
        root = SpanContext(trace, root_id, False, TraceFlags(1))
        spans.append(ReadableSpan("pointsman.request", root, None, resource, attrs, kind=SpanKind.SERVER,
                                  start_time=WALL + 10, end_time=WALL + 20, instrumentation_scope=scope))
        for name, begin, end in children:
            child_ids.append(0x2000 + len(spans))
            spans.append(ReadableSpan(name, SpanContext(trace, child_ids[-1], False, TraceFlags(1)), root, resource,
                                      None, kind=SpanKind.INTERNAL, start_time=WALL + begin, end_time=WALL + end,
                                      instrumentation_scope=scope))
    ids = iter(child_ids * 10_000)  # the stage spans' ids, drawn again in every round
    return records, Origin(resource, scope), Encoder(lambda: next(ids), "pointsman.request"), spans


def per_span(fn: Callable[[Any], object], batch: Any, spans: int) -> float:
    start = time.perf_counter()
    fn(batch)
    return (time.perf_counter() - start) / spans * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=511)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    records, origin, encoder, spans = traces(args.spans)
    assert ExportTraceServiceRequest.FromString(encoder.request(records, origin)) == encode_spans(spans), \
        "they disagree"
    stock, ours, ratios = [], [], []
    for _ in range(args.rounds):
        s = per_span(encode_spans, spans, len(spans))
        o = per_span(lambda rs: encoder.request(rs, origin), records, len(spans))
        stock.append(s)
        ours.append(o)
        ratios.append(s / o)
    print(f"{len(spans)} spans in {len(records)} traces")
    print("| encoder | µs per span (median) |")
    print("|---|---|")
    print(f"| SDK encode_spans | {statistics.median(stock):.2f} |")
    print(f"| epp.observe.wire.Encoder | {statistics.median(ours):.2f} |")
    print(f"\nstock / ours, median of {args.rounds} interleaved rounds: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
