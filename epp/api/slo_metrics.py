"""SLO attainment, predicted and actual, for requests that state objectives (x-llm-d-slo-ttft-ms / -tpot-ms).

A request observer (epp/request/observe.py); it acts only on requests whose decision recorded an SLO verdict
(scheduling/latency/slo.py), so the others cost one dictionary lookup.

- pointsman_slo_requests_total{slo, predicted}      the pick was predicted to meet the objective (`met`) or not
                                                    (`missed`: no endpoint could; a critical request went where
                                                    it missed least)
- pointsman_slo_attained_total{slo, outcome}        the response met it (`met`) or not, as Pointsman saw it: TTFT
                                                    from the decision to the first response body chunk, TPOT from
                                                    there to the end over the output tokens the usage reports;
                                                    needs Envoy's response phases (`--response-phases full`)
- inference_objective_request_ttft_slo_violation_total{model_name, target_model_name}, and _tpot_: llm-d's
  violation counters, from the same measurements
- inference_objective_request_predicted_ttft_seconds / _ttft_seconds{model_name, target_model_name}: the predicted
  and the measured TTFT of these requests (histograms)
- pointsman_slo_placed_total{class}                 the class each was placed as (scheduling/latency/classes.py):
                                                    `tight` (the tightest objective stated lately: it takes the best
                                                    endpoint) or `loose` (it yields the short queues to the tight)
- pointsman_slo_predicted_headroom_seconds{slo, class}  the objective minus the prediction on the pick (negative:
                                                    predicted to miss), per objective the request states (histogram)
- pointsman_slo_held_seconds{outcome}                how long loose requests were held back for tight work
                                                    (epp/flowcontrol/hold.py), by how the hold ended: `released` (its
                                                    pick was no longer busy), `deadline`, `cancelled` (the client
                                                    left), `shutdown` (histogram)
- pointsman_slo_held_requests                       loose requests held now (gauge)

`slo` is `ttft` or `tpot`. Requests shed because no endpoint could meet a sheddable request's objectives are counted
as request errors (ResourceExhausted), like every request that never reaches an engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduling.latency import SloVerdict, decision_slo

if TYPE_CHECKING:
    from epp.request import RequestExchange, Usage

REQ_LABELS = ("model_name", "target_model_name")
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
HELD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
HEADROOM_BUCKETS = (-5.0, -1.0, -0.25, -0.1, -0.025, -0.005, 0.0, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.0, 5.0)


class SloMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("pointsman_slo_requests_total",
                                "Requests with SLO headers, by whether their pick was predicted to meet the objective.",
                                ["slo", "predicted"], registry=registry)
        self.attained = Counter("pointsman_slo_attained_total",
                                "Requests with SLO headers, by whether the response met the objective (seen by "
                                "Pointsman; needs response phases).", ["slo", "outcome"], registry=registry)
        self.violations = {
            "ttft": Counter("inference_objective_request_ttft_slo_violation_total",
                            "Requests whose time to first token exceeded their SLO.", REQ_LABELS, registry=registry),
            "tpot": Counter("inference_objective_request_tpot_slo_violation_total",
                            "Requests whose time per output token exceeded their SLO.", REQ_LABELS,
                            registry=registry),
        }
        self.predicted_ttft = Histogram("inference_objective_request_predicted_ttft_seconds",
                                        "Predicted time to first token of requests with SLO headers.", REQ_LABELS,
                                        buckets=TTFT_BUCKETS, registry=registry)
        self.placed = Counter("pointsman_slo_placed_total",
                              "Requests with SLO headers, by the class they were placed as (tight or loose).",
                              ["class"], registry=registry)
        self.headroom = Histogram("pointsman_slo_predicted_headroom_seconds",
                                  "The objective minus the prediction on the picked endpoint, per objective "
                                  "(negative: predicted to miss).", ["slo", "class"], buckets=HEADROOM_BUCKETS,
                                  registry=registry)
        self.held_s = Histogram("pointsman_slo_held_seconds",
                                "How long loose requests were held back while their pick had tight work pending, by "
                                "how the hold ended.", ["outcome"], buckets=HELD_BUCKETS, registry=registry)
        self.held_now = Gauge("pointsman_slo_held_requests", "Loose requests held back for tight work now.",
                              registry=registry)
        self.ttft = Histogram("inference_objective_request_ttft_seconds",
                              "Measured time to first token of requests with SLO headers (response phases).",
                              REQ_LABELS, buckets=TTFT_BUCKETS, registry=registry)

    # ---- the holds' metrics (epp.flowcontrol.hold.HoldMetrics) -------------------------------------------------
    def held(self, outcome: str, seconds: float) -> None:
        self.held_s.labels(outcome).observe(seconds)

    def holding(self, count: int) -> None:
        self.held_now.set(count)

    # ---- the request observer ----------------------------------------------------------------------------------
    def decided(self, ex: RequestExchange) -> _Follow | None:
        result = ex.result
        verdict = decision_slo(result.state) if result is not None else None
        if verdict is None or result is None:
            return None
        key = result.primary.key
        predicted = verdict.predicted.get(key)
        met = verdict.meets(key)
        slo = verdict.slo
        req = ex.request
        labels = (req.model, req.target_model) if req is not None else ("", "")
        for name, limit in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s)):
            if limit is not None:
                self.requests.labels(name, "met" if met else "missed").inc()
        if predicted is not None and slo.ttft_s is not None:
            self.predicted_ttft.labels(*labels).observe(predicted[0])
        self.placed.labels(verdict.klass).inc()
        for name, room in zip(("ttft", "tpot"), verdict.headroom_of(key), strict=True):
            if room is not None:
                self.headroom.labels(name, verdict.klass).observe(room)
        return _Follow(self, verdict, labels)

    def rejected(self, ex: RequestExchange, code: str) -> None:
        pass

    def outcome(self, name: str, limit: float | None, value: float, labels: tuple[str, str]) -> None:
        if limit is None:
            return
        ok = value <= limit
        self.attained.labels(name, "met" if ok else "missed").inc()
        if not ok:
            self.violations[name].labels(*labels).inc()


class _Follow:
    """One SLO request's response: its first body chunk (TTFT) and its end (TPOT)."""

    __slots__ = ("m", "verdict", "labels", "first")

    def __init__(self, m: SloMetrics, verdict: SloVerdict, labels: tuple[str, str]) -> None:
        self.m = m
        self.verdict = verdict
        self.labels = labels
        self.first: float | None = None

    def response_headers(self, ex: RequestExchange, status: int, served: str | None) -> None:
        pass

    def response_chunk(self, ex: RequestExchange, size: int, end_of_stream: bool) -> None:
        if self.first is None and size > 0:
            self.first = ex.d.clock()  # the director's clock, which `ex.started` is on
            ttft = self.first - ex.started
            self.m.ttft.labels(*self.labels).observe(ttft)
            self.m.outcome("ttft", self.verdict.slo.ttft_s, ttft, self.labels)

    def closed(self, ex: RequestExchange, usage: Usage | None) -> None:
        tokens = usage.completion_tokens if usage is not None else 0
        if self.first is None or not tokens or tokens < 2:
            return
        tpot = (ex.d.clock() - self.first) / (tokens - 1)
        self.m.outcome("tpot", self.verdict.slo.tpot_s, tpot, self.labels)
