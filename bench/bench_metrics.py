"""The request path's metrics per request: GIE's families with llm-d's llm_d_epp_* twins (epp/api/metric_twins.py,
every update written to both, batched and folded at scrape time) against GIE's families alone, updated per call
through prometheus_client (what the request path would cost without the batching, and without the twins).

Each request: started (request total, running), finished (running, duration, request bytes, input and output
tokens), one scheduling duration; a scrape (the exposition text) every `--scrape-every` requests, its cost shared
out. Cases interleave round by round; medians per request and the ratio to `gie-plain` are printed.

    .venv/bin/python bench/bench_metrics.py --rounds 7 --requests 20000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest  # noqa: E402

from bench.micro import interleave  # noqa: E402
from epp.api.metrics import (  # noqa: E402
    DURATION_BUCKETS,
    OUTPUT_TOKEN_BUCKETS,
    SCHEDULER_BUCKETS,
    SIZE_BUCKETS,
    TOKEN_BUCKETS,
    EppMetrics,  # noqa: E402
)

MODELS = [f"model-{i}" for i in range(4)]


class GiePlain:
    """GIE's request families only, one prometheus_client call per update (children cached)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["model_name", "target_model_name"]
        self.requests = Counter("inference_objective_request_total", "", [*labels, "priority"], registry=r)
        self.running = Gauge("inference_objective_running_requests", "", ["model_name"], registry=r)
        self.duration = Histogram("inference_objective_request_duration_seconds", "", labels,
                                  buckets=DURATION_BUCKETS, registry=r)
        self.sizes = Histogram("inference_objective_request_sizes", "", labels, buckets=SIZE_BUCKETS, registry=r)
        self.inp = Histogram("inference_objective_input_tokens", "", labels, buckets=TOKEN_BUCKETS, registry=r)
        self.out = Histogram("inference_objective_output_tokens", "", labels, buckets=OUTPUT_TOKEN_BUCKETS,
                             registry=r)
        self.sched = Histogram("inference_extension_scheduler_e2e_duration_seconds", "", buckets=SCHEDULER_BUCKETS,
                               registry=r)
        self.cache: dict[tuple[Any, ...], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), labels)
        c = self.cache.get(key)
        if c is None:
            c = self.cache[key] = metric.labels(*labels)
        return c

    def one(self, model: str, d: float) -> None:
        self.child(self.requests, model, model, "0").inc()
        self.child(self.running, model).inc()
        self.sched.observe(d / 1000)
        self.child(self.running, model).dec()
        self.child(self.duration, model, model).observe(d)
        self.child(self.sizes, model, model).observe(900)
        self.child(self.inp, model, model).observe(220)
        self.child(self.out, model, model).observe(40)

    def scrape(self) -> bytes:
        return generate_latest(self.registry)


class Twins:
    """Pointsman's EppMetrics: GIE's families and llm-d's twins, batched."""

    def __init__(self) -> None:
        self.m = EppMetrics()

    def one(self, model: str, d: float) -> None:
        m = self.m
        m.request_started(model, model, 0)
        m.scheduler_duration(d / 1000)
        m.request_finished(model, model, d, 220, 40, 0, "default-flow", 900)

    def scrape(self) -> bytes:
        return self.m.exposition()


def run(case: Any, opts: dict[str, int]) -> float:
    n, every = opts["requests"], opts["scrape_every"]
    t0 = time.perf_counter()
    for i in range(n):
        case.one(MODELS[i % len(MODELS)], 0.05 + (i % 97) * 0.01)
        if i % every == every - 1:
            case.scrape()
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--scrape-every", type=int, default=1000)
    a = ap.parse_args()
    opts = {"requests": a.requests, "scrape_every": a.scrape_every}
    interleave({"gie-plain": (GiePlain(), opts), "twins": (Twins(), opts)}, a.rounds, run, "gie-plain")


if __name__ == "__main__":
    main()
