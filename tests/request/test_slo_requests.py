"""Requests with SLO headers through the shell's request path with the built-in default scheduler: a sheddable
request no endpoint can serve in time is shed (429), a critical one is routed where it misses least, and the SLO
metrics count predicted and measured attainment."""

from __future__ import annotations

import random

import orjson
from prometheus_client import CollectorRegistry

from epp.api.slo_metrics import SloMetrics
from epp.fleet.datastore import Datastore, PoolSpec
from epp.request.director import DESTINATION, Director
from scheduling.config import load_scheduler
from scheduling.types import Endpoint, Metrics, endpoint_key

HDRS = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json"}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def rig(running: tuple[int, ...] = (0, 0)) -> tuple[Director, SloMetrics, CollectorRegistry, Clock]:
    ds = Datastore()
    eps = [Endpoint(endpoint_key(f"10.0.0.{i}", 8000), f"10.0.0.{i}", 8000,
                    metrics=Metrics(running=n, stale=False, updated_at=0.0)) for i, n in enumerate(running, 1)]
    ds.set_pool(PoolSpec("pool"), eps)
    ds.objectives = {"batch": -1, "chat": 5}
    registry = CollectorRegistry()
    slo = SloMetrics(registry)
    clock = Clock()
    d = Director(ds, load_scheduler(None, rng=random.Random(0)), clock=clock, observers=[slo])
    return d, slo, registry, clock


def body(n: int = 1) -> bytes:
    return orjson.dumps({"model": "llama", "max_tokens": 8,
                         "messages": [{"role": "user", "content": "q" * 4000 + str(n)}]})


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_a_sheddable_request_no_endpoint_can_serve_in_time_is_shed_and_a_critical_one_is_routed():
    d, _, registry, _ = rig()
    impossible = {**HDRS, "x-llm-d-slo-ttft-ms": "1"}  # 1 ms: no endpoint is predicted to meet it
    ex = d.exchange()
    out = ex.decide({**impossible, "x-llm-d-inference-objective": "batch"}, body(), {})
    assert out.reject_status == 429 and "sheddable" in out.reject_body and "ttft 1 ms" in out.reject_body
    assert d.datastore.inflight.view() == {}  # nothing was committed
    ex = d.exchange()
    out = ex.decide({**impossible, "x-llm-d-inference-objective": "chat"}, body(), {})
    assert out.reject_status == 0 and dict(out.set_headers)[DESTINATION]
    assert value(registry, "pointsman_slo_requests_total", slo="ttft", predicted="missed") == 1
    ex.close()
    ex = d.exchange()  # sheddable, but the objective is within reach: routed
    out = ex.decide({**HDRS, "x-llm-d-slo-ttft-ms": "5000", "x-llm-d-inference-objective": "batch"}, body(), {})
    assert out.reject_status == 0
    assert value(registry, "pointsman_slo_requests_total", slo="ttft", predicted="met") == 1
    ex.close()


def test_measured_attainment_comes_from_the_response_path():
    d, _, registry, clock = rig()
    hdrs = {**HDRS, "x-llm-d-slo-ttft-ms": "500", "x-llm-d-slo-tpot-ms": "20"}
    ex = d.exchange()
    ex.decide(hdrs, body(), {})
    ex.response_headers({":status": "200", "content-type": "text/event-stream"}, {})
    clock.t += 0.2  # the first chunk 200 ms after the decision: within 500 ms
    ex.response_body(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', False)
    clock.t += 0.35  # 7 more tokens in 350 ms: 50 ms per token, over the 20 ms objective
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":8}}\n\ndata: [DONE]\n\n'
    ex.response_body(usage, True)
    ex.close()
    assert value(registry, "pointsman_slo_attained_total", slo="ttft", outcome="met") == 1
    assert value(registry, "pointsman_slo_attained_total", slo="tpot", outcome="missed") == 1
    assert value(registry, "inference_objective_request_tpot_slo_violation_total", model_name="llama",
                 target_model_name="llama") == 1
    assert value(registry, "inference_objective_request_ttft_seconds_count", model_name="llama",
                 target_model_name="llama") == 1


def test_the_class_and_the_predicted_headroom_are_counted():
    """The plain header names (x-slo-*) work as llm-d's; a tight request then a looser one: each counted by the class
    it was placed as, with its predicted headroom on the pick (the objective minus the prediction)."""
    d, _, registry, clock = rig()
    for ttft in ("250", "2000"):
        ex = d.exchange()
        out = ex.decide({**HDRS, "x-slo-ttft-ms": ttft, "x-slo-tpot-ms": "20"}, body(), {})
        assert out.reject_status == 0
        ex.close()
        clock.t += 1.0
    assert value(registry, "pointsman_slo_placed_total", **{"class": "tight"}) == 1
    assert value(registry, "pointsman_slo_placed_total", **{"class": "loose"}) == 1
    # a 1,000-token prompt nobody holds: 30 ms + 1,000 x 250 us = 280 ms predicted, 30 ms over the tight objective,
    # 1.72 s within the loose one (negative buckets: the histogram keeps no _sum, as OpenMetrics has it)
    for klass, below_zero in (("tight", 1), ("loose", 0)):
        labels = {"slo": "ttft", "class": klass}
        assert value(registry, "pointsman_slo_predicted_headroom_seconds_count", **labels) == 1
        assert value(registry, "pointsman_slo_predicted_headroom_seconds_bucket", le="0.0", **labels) == below_zero
        assert value(registry, "pointsman_slo_predicted_headroom_seconds_bucket", le="-0.1", **labels) == 0
        assert value(registry, "pointsman_slo_predicted_headroom_seconds_bucket", le="2.0", **labels) == 1
        assert value(registry, "pointsman_slo_predicted_headroom_seconds_count", slo="tpot", **{"class": klass}) == 1


def test_a_sheddable_loose_request_does_not_take_the_tight_class_last_room():
    """Three of four endpoints run 12 requests each (a 21.6 ms TPOT: no room for a 20 ms objective); the idle one is
    the tight class's last room. A sheddable loose request that would take it is shed; a critical one is routed."""
    d, _, _, clock = rig((0, 12, 12, 12))
    ex = d.exchange()  # the tight class: 250 ms TTFT, 20 ms TPOT
    assert ex.decide({**HDRS, "x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20"}, body(), {}).reject_status == 0
    ex.close()
    clock.t += 1.0
    loose = {**HDRS, "x-slo-ttft-ms": "400"}  # met only on the idle endpoint (280 ms there, 504 ms on the others)
    ex = d.exchange()
    out = ex.decide({**loose, "x-llm-d-inference-objective": "batch"}, body(2), {})
    assert out.reject_status == 429 and "nearly full" in out.reject_body
    ex = d.exchange()
    out = ex.decide({**loose, "x-llm-d-inference-objective": "chat"}, body(3), {})
    assert out.reject_status == 0 and dict(out.set_headers)[DESTINATION] == "10.0.0.1:8000"
    ex.close()
    d2, _, _, clock2 = rig((0, 0, 12, 12))  # the room not scarce (two idle of four): the sheddable loose one goes
    ex = d2.exchange()
    ex.decide({**HDRS, "x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20"}, body(), {})
    ex.close()
    clock2.t += 1.0
    ex = d2.exchange()
    assert ex.decide({**loose, "x-llm-d-inference-objective": "batch"}, body(2), {}).reject_status == 0
    ex.close()
