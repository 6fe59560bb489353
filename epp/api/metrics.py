"""Pointsman's own Prometheus metrics, with the Gateway API Inference Extension (GIE) names.

Request path (`RequestMetrics`, a request observer in epp/api/request_metrics.py, calls these):
- inference_objective_request_total{model_name, target_model_name, priority}            counter
- inference_objective_request_error_total{model_name, target_model_name, error_code}    counter
- inference_objective_request_duration_seconds{model_name, target_model_name}           histogram
- inference_objective_input_tokens / _output_tokens{model_name, target_model_name}      histograms
- inference_objective_running_requests{model_name}                                      gauge
- inference_extension_scheduler_e2e_duration_seconds                                    histogram
- inference_extension_plugin_duration_seconds{extension_point, plugin_type, plugin_name} histogram
- disagg_decision_total{model_name, decision_type}                                      counter

ext_proc layer (the grpc server calls this):
- pointsman_protocol_violations_total{kind}   streams ended by an ext_proc protocol violation  counter

Flow control (epp.flowcontrol calls these; GIE's names and labels):
- inference_extension_flow_control_request_queue_duration_seconds{fairness_id, priority, outcome, inference_pool,
  model_name, target_model_name}                                                         histogram
- inference_extension_flow_control_request_enqueue_duration_seconds{fairness_id, priority, outcome}  histogram
- inference_extension_flow_control_dispatch_cycle_duration_seconds                       histogram
- inference_extension_flow_control_queue_size / _queue_bytes{fairness_id, priority, inference_pool, model_name,
  target_model_name}                                                                     gauges
- inference_extension_flow_control_pool_saturation{inference_pool}                       gauge
  (fairness_id: the first 1000 distinct ids, then "other": they come from a client header)

Endpoint health (epp.fleet.passive and the scraper; the gauges in epp/api/metrics_gauges.py):
- pointsman_endpoint_response_failures_total{endpoint, reason}   failed responses: http_5xx | cut_short | silent
- pointsman_endpoint_ejections_total{endpoint, source}           times passive health took it out of rotation
- pointsman_endpoint_state{endpoint, state}                      1 for its state: healthy | out (failed scrapes) |
                                                                 ejected | probing (computed at scrape time)
- pointsman_endpoint_scrape_failures{endpoint}                   consecutive failed scrapes (computed at scrape time)

Pool gauges, computed from the datastore at scrape time (so never stale; epp/api/metrics_gauges.py):
- inference_pool_average_kv_cache_utilization{name}, inference_pool_average_queue_size{name},
  inference_pool_ready_pods{name}, inference_pool_per_pod_queue_size{name, model_server_pod}

Each EppMetrics owns a private CollectorRegistry, so tests (and several servers in one process) never collide.
Contract: call `request_finished` exactly once for every `request_started`, errors included, so that the running
gauge returns to zero.

Cost: a prometheus_client update takes a lock and several Python calls (about 2 µs; 16 µs of the director's ~70 µs
per request went to metrics). The request path therefore only adds to plain dicts and lists on the event loop;
they are folded into the prometheus objects before every collection (a collector registered first in the
registry folds them, so /metrics, `exposition()` and `registry.get_sample_value` always see every update) and
whenever 1024 observations are pending (bounded memory when nobody scrapes). Histograms are folded per bucket
(one increment per bucket and one for the sum), with exactly `Histogram.observe`'s bucket choice. The pending
updates and the cached labelled children are a `Batch` (epp/api/metrics_batch.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from epp.api.metric_twins import (
    LLMD_DURATION_BUCKETS,
    LLMD_FLOW_BUCKETS,
    LLMD_INPUT_TOKEN_BUCKETS,
    LLMD_OUTPUT_TOKEN_BUCKETS,
    LLMD_REQUEST_SIZE_BUCKETS,
    LLMD_RESPONSE_SIZE_BUCKETS,
    LLMD_SCHEDULER_BUCKETS,
    twin_counter,
    twin_gauge,
    twin_histogram,
)
from epp.api.metrics_batch import Batch, FoldCollector
from epp.api.metrics_gauges import HealthCollector, PoolCollector
from epp.api.request_metrics import PLUGIN_SAMPLE_EVERY as PLUGIN_SAMPLE_EVERY  # re-exported
from epp.api.request_metrics import RequestMetrics as RequestMetrics  # re-exported
from epp.fleet import Datastore
from epp.flowcontrol import DEFAULT_FLOW

if TYPE_CHECKING:
    from epp.fleet import PassiveHealth

log = logging.getLogger(__name__)

REQ_LABELS = ("model_name", "target_model_name")
DURATION_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30,
                    45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144,
                 524288, 1048576)
OUTPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SIZE_BUCKETS = tuple(float(2 ** i) for i in range(6, 31))  # request bytes: 64 B .. 1 GiB
RESPONSE_SIZE_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
LLMD_REQ_LABELS = ("model_name", "target_model_name", "fairness_id", "priority")
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
FAIRNESS_LABELS = 1000  # distinct fairness ids with their own flow-control series; the rest share "other"
FLOW_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PLUGIN_BUCKETS = (0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)


class EppMetrics:
    def __init__(self, datastore: Datastore | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # With `epp serve --workers N` another process reads this one's values from memory-mapped files and no
        # collection here would fold them: update prometheus at once.
        self.batch = Batch(batched=not os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        r.register(FoldCollector(self.batch))  # first: collections fold the pending updates before reading anything
        self._add_request_metrics(r)
        self.disagg = Counter("disagg_decision_total", "P/D decisions: decode-only or prefill-decode.",
                              ["model_name", "decision_type"], registry=r)
        self.violations = Counter("pointsman_protocol_violations_total",
                                  "ext_proc streams ended by a protocol violation, by rule.", ["kind"], registry=r)
        self._add_flow_metrics(r)
        self.endpoint_failures = Counter("pointsman_endpoint_response_failures_total",
                                         "Failed responses by endpoint and kind (passive health).",
                                         ["endpoint", "reason"], registry=r)
        self.endpoint_ejections = Counter("pointsman_endpoint_ejections_total",
                                          "Times an endpoint was taken out of rotation.", ["endpoint", "source"],
                                          registry=r)
        self._health_collector: HealthCollector | None = None
        self._flow_queued: dict[tuple[str, ...], int] = {}
        self._fairness_ids: set[str] = set()
        self._pool_collector: PoolCollector | None = None
        if datastore is not None:
            self.bind_datastore(datastore)

    def _add_request_metrics(self, r: CollectorRegistry) -> None:
        """The request path's and the scheduler's series."""
        # GIE's request series and llm-d-router's llm_d_epp_* twins (epp/api/metric_twins.py): label values are
        # given in the twin's order (model, target, fairness id, priority[, ...]); GIE's take the ones they have.
        self.requests = twin_counter(r, "inference_objective_request_total", "llm_d_epp_request_total",
                                     "Requests per model, fairness id and objective priority.",
                                     [*REQ_LABELS, "priority"], LLMD_REQ_LABELS)
        self.errors = twin_counter(r, "inference_objective_request_error_total", "llm_d_epp_request_error_total",
                                   "Failed requests by error code.", [*REQ_LABELS, "error_code"],
                                   [*LLMD_REQ_LABELS, "error_code"])
        self.duration = twin_histogram(r, "inference_objective_request_duration_seconds",
                                       "llm_d_epp_request_duration_seconds", "End-to-end request latency.",
                                       REQ_LABELS, LLMD_REQ_LABELS, DURATION_BUCKETS, LLMD_DURATION_BUCKETS)
        self.request_sizes = twin_histogram(r, "inference_objective_request_sizes", "llm_d_epp_request_size_bytes",
                                            "Request body size in bytes.", REQ_LABELS, LLMD_REQ_LABELS,
                                            SIZE_BUCKETS, LLMD_REQUEST_SIZE_BUCKETS)
        self.response_sizes = twin_histogram(r, "inference_objective_response_sizes", "llm_d_epp_response_size_bytes",
                                             "Response body size in bytes (response phases).", REQ_LABELS,
                                             LLMD_REQ_LABELS, RESPONSE_SIZE_BUCKETS, LLMD_RESPONSE_SIZE_BUCKETS)
        self.input_tokens = twin_histogram(r, "inference_objective_input_tokens", "llm_d_epp_request_input_tokens",
                                           "Prompt tokens per request.", REQ_LABELS, LLMD_REQ_LABELS,
                                           TOKEN_BUCKETS, LLMD_INPUT_TOKEN_BUCKETS)
        self.output_tokens = twin_histogram(r, "inference_objective_output_tokens",
                                            "llm_d_epp_request_output_tokens", "Output tokens per request.",
                                            REQ_LABELS, LLMD_REQ_LABELS, OUTPUT_TOKEN_BUCKETS,
                                            LLMD_OUTPUT_TOKEN_BUCKETS)
        # livesum: with `epp serve --workers N` (prometheus-client multiprocess mode) the live workers' sum.
        self.running = twin_gauge(r, "inference_objective_running_requests", "llm_d_epp_request_running",
                                  "Requests in flight.", ["model_name"], LLMD_REQ_LABELS, multiprocess_mode="livesum")
        self.scheduler = twin_histogram(r, "inference_extension_scheduler_e2e_duration_seconds",
                                        "llm_d_epp_scheduler_e2e_duration_seconds", "Scheduling latency per request.",
                                        [], [], SCHEDULER_BUCKETS, LLMD_SCHEDULER_BUCKETS)
        self.attempts = twin_counter(r, "inference_extension_scheduler_attempts_total",
                                     "llm_d_epp_scheduler_attempts_total",
                                     "Scheduling attempts: success (with the picked endpoint) or failure.",
                                     ["status", "target_model_name", "pod_name", "namespace", "port"],
                                     ["status", "target_model_name", "endpoint_name", "namespace", "port"],
                                     rename={"endpoint_name": "pod_name"})
        self.plugin = twin_histogram(r, "inference_extension_plugin_duration_seconds",
                                     "llm_d_epp_plugin_duration_seconds", "Latency of one plugin call.",
                                     ["extension_point", "plugin_type", "plugin_name"],
                                     ["extension_point", "plugin_type", "plugin_name"], PLUGIN_BUCKETS,
                                     LLMD_SCHEDULER_BUCKETS)

    def _add_flow_metrics(self, r: CollectorRegistry) -> None:
        """Flow control's series (GIE's names)."""
        flow_labels = ["fairness_id", "priority", "inference_pool", *REQ_LABELS]
        outcome_labels = ["fairness_id", "priority", "outcome", "inference_pool", *REQ_LABELS]
        enqueue_labels = ["fairness_id", "priority", "outcome"]
        self.flow_duration = twin_histogram(
            r, "inference_extension_flow_control_request_queue_duration_seconds",
            "llm_d_epp_flow_control_request_queue_duration_seconds",
            "Time requests spend in flow control, from enqueue to their outcome.", outcome_labels, outcome_labels,
            FLOW_BUCKETS, LLMD_FLOW_BUCKETS)
        self.flow_enqueue_duration = twin_histogram(
            r, "inference_extension_flow_control_request_enqueue_duration_seconds",
            "llm_d_epp_flow_control_request_enqueue_duration_seconds",
            "Time taken to enqueue requests into flow control.", enqueue_labels, enqueue_labels, SCHEDULER_BUCKETS,
            LLMD_SCHEDULER_BUCKETS)
        self.flow_cycle_duration = twin_histogram(
            r, "inference_extension_flow_control_dispatch_cycle_duration_seconds",
            "llm_d_epp_flow_control_dispatch_cycle_duration_seconds", "Time taken by one flow-control dispatch cycle.",
            [], [], SCHEDULER_BUCKETS, LLMD_SCHEDULER_BUCKETS)
        self.flow_size = twin_gauge(r, "inference_extension_flow_control_queue_size",
                                    "llm_d_epp_flow_control_queue_size", "Requests held in the flow-control queue.",
                                    flow_labels, flow_labels)
        self.flow_bytes = twin_gauge(r, "inference_extension_flow_control_queue_bytes",
                                     "llm_d_epp_flow_control_queue_bytes",
                                     "Bytes of the requests held in the flow-control queue.", flow_labels, flow_labels)
        self.flow_saturation_gauge = twin_gauge(r, "inference_extension_flow_control_pool_saturation",
                                                "llm_d_epp_flow_control_pool_saturation",
                                                "Saturation of the inference pool as flow control sees it (1 = full).",
                                                ["inference_pool"], ["inference_pool"])

    def requests_total(self) -> float:
        """Requests decided so far, over every label (pending updates folded first)."""
        self.batch.fold()
        return float(sum(s.value for family in self.requests.gie.collect() for s in family.samples
                         if s.name.endswith("_total")))

    # ---- the director's calls ----------------------------------------------------------------------------
    # `fairness` is the request's fairness id (llm-d's `fairness_id` label; only the twins carry it), capped
    # like flow control's: the first FAIRNESS_LABELS distinct ids, then "other".
    def request_started(self, model: str, target: str, priority: int | str, fairness: str = DEFAULT_FLOW) -> None:
        labels = (model, target, self._fairness_label(fairness), str(priority))
        b = self.batch
        b.inc(b.child(self.requests, *labels))
        b.inc(b.child(self.running, *labels))

    def request_error(self, model: str, target: str, code: str, priority: int | str = "",
                      fairness: str = DEFAULT_FLOW) -> None:
        self.batch.inc(self.batch.child(self.errors, model, target, self._fairness_label(fairness), str(priority), str(code)))

    def request_finished(
        self,
        model: str,
        target: str,
        duration_s: float | None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        priority: int | str = "",
        fairness: str = DEFAULT_FLOW,
        request_bytes: int | None = None,
        response_bytes: int | None = None,
    ) -> None:
        labels = (model, target, self._fairness_label(fairness), str(priority))
        b = self.batch
        b.inc(b.child(self.running, *labels), -1.0)
        if duration_s is not None:
            b.observe(b.child(self.duration, *labels), duration_s)
        if request_bytes:
            b.observe(b.child(self.request_sizes, *labels), request_bytes)
        if response_bytes:
            b.observe(b.child(self.response_sizes, *labels), response_bytes)
        if input_tokens:
            b.observe(b.child(self.input_tokens, *labels), input_tokens)
        if output_tokens:
            b.observe(b.child(self.output_tokens, *labels), output_tokens)

    def scheduler_duration(self, seconds: float) -> None:
        self.batch.observe(self.batch.child(self.scheduler), seconds)

    def scheduler_attempt(self, target: str, endpoint: str = "", namespace: str = "", port: str = "") -> None:
        """A scheduling attempt: success with the picked endpoint (pod name, namespace, port), failure without."""
        status = "success" if endpoint else "failure"
        self.batch.inc(self.batch.child(self.attempts, status, target, endpoint, namespace, port))

    def plugin_duration(self, ext_point: str, plugin_type: str, plugin_name: str, seconds: float) -> None:
        self.batch.observe(self.batch.child(self.plugin, ext_point, plugin_type, plugin_name), seconds)

    def disagg_decision(self, model: str, decision: str) -> None:
        self.batch.inc(self.batch.child(self.disagg, model, decision))

    # ---- the ext_proc layer's calls -----------------------------------------------------------------------
    def protocol_violation(self, kind: str) -> None:
        self.batch.inc(self.batch.child(self.violations, kind))

    # ---- flow control ------------------------------------------------------------------------------------
    def _fairness_label(self, fairness_id: str) -> str:
        """Fairness ids come from a client header: the first FAIRNESS_LABELS distinct ones get their own series,
        later ones share `other`, so a client cannot grow the registry without bound."""
        seen = self._fairness_ids
        if fairness_id in seen:
            return fairness_id
        if len(seen) < FAIRNESS_LABELS:
            seen.add(fairness_id)
            return fairness_id
        return "other"

    def flow_queue(self, fairness_id: str, priority: int, pool: str, model: str, target: str, count: int,
                   size: int) -> None:
        labels = (self._fairness_label(fairness_id), str(priority), pool, model, target)
        left = self._flow_queued.get(labels, 0) + count
        self.batch.child(self.flow_size, *labels).inc(count)
        self.batch.child(self.flow_bytes, *labels).inc(size)
        if left > 0:
            self._flow_queued[labels] = left
        else:  # the flow has nothing queued: drop its series (fairness ids come from clients)
            self._flow_queued.pop(labels, None)
            for metric in (self.flow_size, self.flow_bytes):
                self.batch.forget(metric, labels)
                try:
                    metric.remove(*labels)
                except KeyError:
                    pass

    def flow_outcome(self, fairness_id: str, priority: int, outcome: str, pool: str, model: str, target: str,
                     seconds: float) -> None:
        fid = self._fairness_label(fairness_id)
        self.batch.child(self.flow_duration, fid, str(priority), outcome, pool, model, target).observe(seconds)

    def flow_enqueue(self, fairness_id: str, priority: int, outcome: str, seconds: float) -> None:
        self.batch.child(self.flow_enqueue_duration, self._fairness_label(fairness_id), str(priority),
                    outcome).observe(seconds)

    def flow_saturation(self, pool: str, saturation: float) -> None:
        self.batch.child(self.flow_saturation_gauge, pool).set(saturation)

    def flow_cycle(self, seconds: float) -> None:
        self.batch.child(self.flow_cycle_duration).observe(seconds)

    # ---- endpoint health -------------------------------------------------------------------------------
    def endpoint_failure(self, key: str, kind: str) -> None:
        self.batch.child(self.endpoint_failures, key, kind).inc()

    def endpoint_ejected(self, key: str, source: str) -> None:
        self.batch.child(self.endpoint_ejections, key, source).inc()

    def bind_health(self, passive: PassiveHealth) -> None:
        """Serve the endpoint state gauges from this passive-health tracker (and its scraper)."""
        if self._health_collector is not None:
            self.registry.unregister(self._health_collector)
        self._health_collector = HealthCollector(passive)
        self.registry.register(self._health_collector)

    # ---- pool gauges -------------------------------------------------------------------------------------
    def bind_datastore(self, datastore: Datastore) -> None:
        """Serve the inference_pool_* gauges computed from this datastore at every scrape."""
        if self._pool_collector is not None:
            self.registry.unregister(self._pool_collector)
        self._pool_collector = PoolCollector(datastore)
        self.registry.register(self._pool_collector)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def start_metrics_server(
    metrics: EppMetrics,
    port: int = 9090,
    host: str = "0.0.0.0",
    setup: Callable[[web.Application], None] | None = None,
    middlewares: Sequence[Any] = (),
) -> web.AppRunner:
    """Serve GET /metrics on the running loop (`--metrics-port`). Stop with `await runner.cleanup()`.

    `setup` adds more routes to the same server (the dashboard, epp.api.dashboard); `middlewares` guard them
    (`--metrics-endpoint-auth`: epp/api/metrics_auth.py)."""

    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(middlewares=list(middlewares))
    app.router.add_get("/metrics", handle)
    if setup is not None:
        setup(app)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("Prometheus metrics on %s:%d/metrics", host, port)
    return runner
