"""OTLP span encoding: the SDK's stock encoder against epp/observe/otlp.py's in-place encoder, interleaved.

Each round encodes the same batch of spans shaped like Pointsman's (a request span and its stage spans with a
dozen attributes) with both encoders in turn; the table gives the median µs per span of each and their ratio
per round, so a noisy machine moves both sides of a ratio alike.

    .venv/bin/python bench/bench_tracing_encode.py [--spans 512] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from epp.observe.otlp import encode

STAGES = ("resolve", "admit", "prepare", "queue", "schedule", "commit")


def batch(n: int) -> list[ReadableSpan]:
    resource = Resource.create({"service.name": "pointsman", "service.instance.id": "epp-0"})
    scope = InstrumentationScope("pointsman", "1.0")
    spans: list[ReadableSpan] = []
    trace = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    while len(spans) < n:
        trace += 1
        root = SpanContext(trace, 0x1000 + len(spans), False, TraceFlags(1))
        attrs = {"gen_ai.request.model": "llama-3-8b", "pointsman.pool": "pool-a", "pointsman.profile": "default",
                 "pointsman.endpoint": "10.0.0.7:8000", "pointsman.decision": "d-123456", "http.status": 200,
                 "gen_ai.usage.input_tokens": 1234, "gen_ai.usage.output_tokens": 56, "pointsman.queued": False,
                 "pointsman.candidates": 8, "pointsman.score": 0.875, "pointsman.outcome": "routed"}
        spans.append(ReadableSpan("pointsman.request", root, None, resource, attrs, kind=SpanKind.SERVER,
                                  start_time=10, end_time=20, instrumentation_scope=scope))
        for i, stage in enumerate(STAGES):
            child = SpanContext(trace, 0x2000 + len(spans), False, TraceFlags(1))
            spans.append(ReadableSpan(f"pointsman.{stage}", child, root, resource, {"pointsman.stage": i},
                                      kind=SpanKind.INTERNAL, start_time=11, end_time=12,
                                      instrumentation_scope=scope))
    return spans[:n]


def per_span(fn, spans: list[ReadableSpan]) -> float:
    start = time.perf_counter()
    fn(spans)
    return (time.perf_counter() - start) / len(spans) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    spans = batch(args.spans)
    assert encode(spans) == encode_spans(spans), "the encoders disagree"
    stock, ours, ratios = [], [], []
    for _ in range(args.rounds):
        s, o = per_span(encode_spans, spans), per_span(encode, spans)
        stock.append(s)
        ours.append(o)
        ratios.append(s / o)
    print("| encoder | µs per span (median) |")
    print("|---|---|")
    print(f"| SDK encode_spans | {statistics.median(stock):.2f} |")
    print(f"| epp.observe.otlp.encode | {statistics.median(ours):.2f} |")
    print(f"\nstock / ours, median of {args.rounds} interleaved rounds: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
