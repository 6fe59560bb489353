"""The sampling decision of one request (`Tracing.begin`), in process: what an unsampled request pays with tracing on.

Cases, interleaved round by round (median µs per call, the best round in brackets): no parent and a 1% ratio (a
64-bit draw), an unsampled parent in the ext_proc stream's metadata (as Envoy sends it when it traces and did not
sample) and in the client's headers, and a sampled new trace (the Trace object is made) for comparison. The
metadata is what Envoy's ext_proc filter sends on the h2 transport (bytes pairs).

    .venv/bin/python bench/bench_trace_sampling.py [--rounds 7] [--calls 100000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from epp.observe import Tracing, TracingSettings  # noqa: E402

PARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
MD = [(b":path", b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"), (b"content-type", b"application/grpc"),
      (b"te", b"trailers"), (b"x-envoy-internal", b"true"), (b"grpc-timeout", b"200m")]
HEADERS = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json",
           "x-request-id": "bench", "user-agent": "wrk"}


class NoExport:
    def export(self, batch: object) -> None:
        pass

    def shutdown(self) -> None:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=100_000)
    args = ap.parse_args()
    one = Tracing(TracingSettings(enabled=True, sample_ratio=0.01), exporter=NoExport())
    every = Tracing(TracingSettings(enabled=True, sample_ratio=1.0), exporter=NoExport())
    cases = {
        "no parent, 1%": (one, MD, HEADERS),
        "unsampled parent in the stream metadata": (one, [*MD, (b"traceparent", PARENT)], HEADERS),
        "unsampled parent in the request headers": (one, MD, {**HEADERS, "traceparent": PARENT.decode()}),
        "sampled new trace (100%)": (every, MD, HEADERS),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    try:
        for _ in range(args.rounds):
            for name, (tracing, md, headers) in cases.items():
                begin = tracing.begin
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    begin(md, headers)
                times[name].append((time.perf_counter() - t0) / args.calls)
    finally:
        one.shutdown()
        every.shutdown()
    print(f"{args.rounds} interleaved rounds x {args.calls} calls; µs per call, medians (best round)\n")
    print("| case | µs |\n|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts) * 1e6:.2f} ({min(ts) * 1e6:.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
