"""Explain is a mode of the exchange: random requests are explained and then sent for real, in the same state, and
get the same outcome (status, endpoint, reason; a queued request is explained as queued). The state they share is
real: a Kthena route's token rate limit, the sheddable-saturation admitter or flow control (bands, a capacity
limit), SLO shedding by the default scheduler's latency model, passive health and its probes, requests kept in
flight. Two cases that once differed are pinned explicitly: a sheddable request with an unattainable SLO (429 for
real and in explain) and a pending passive-health probe (the real request and explain both name the probed
endpoint)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from epp.api.explain import PointsmanService
from epp.api.pb import pointsman_pb2 as api
from epp.fleet.datastore import Datastore
from epp.fleet.passive import PassiveHealth
from epp.fleet.saturation import ConcurrencyDetector
from epp.flowcontrol import FlowController, PoolPressure
from epp.protocol import Outcome
from epp.ratelimit import Limiter
from epp.ratelimit.gate import RateLimitGate
from epp.request.admit import SheddableAdmitter
from epp.request.director import DESTINATION, Director, DirectorConfig
from epp.routing.service import RoutingService
from scheduling.api import FlowControl, PriorityBand
from scheduling.config import load_scheduler

ROUTES = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: a}
spec:
  inferenceEngine: vLLM
  workloadPort: {port: 8000}
  endpoints: [{name: a0, address: 10.0.0.1}, {name: a1, address: 10.0.0.2}, {name: a2, address: 10.0.0.3}]
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: limited}
spec:
  modelName: llama
  rateLimit: {inputTokensPerUnit: 600, unit: minute}
  rules:
  - {name: x, targetModels: [{modelServerName: a}]}
"""
PATH = "/v1/chat/completions"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Rig:
    director: Director
    passive: PassiveHealth
    clock: Clock
    flow: FlowController | None
    kept: list = field(default_factory=list)


def rig(flow_control: bool, seed: int, tokens_per_minute: int = 1200) -> Rig:
    clock = Clock()
    ds = Datastore()
    ds.objectives = {"batch": -1, "chat": 5}
    svc = RoutingService(ds, random.Random(seed))
    svc.load_text(ROUTES.replace("600", str(tokens_per_minute)), "routes.yaml")
    assert not svc.documents.errors, svc.documents.errors
    detector = ConcurrencyDetector(ds.inflight, max_concurrency=1)  # 3 endpoints x 1: saturated at 3 in flight
    passive = PassiveHealth(ds, failure_threshold=1, cooldown=5.0, max_cooldown=10.0, silence_timeout=60.0,
                            clock=clock)
    flow = None
    admitters: list = [RateLimitGate(Limiter(clock=clock))]
    if flow_control:
        config = FlowControl(default_band=PriorityBand(max_requests=1))  # each band holds 1 queued request
        flow = FlowController(config, PoolPressure(ds, ds.routable, detector, clock=clock), clock=clock)
    else:
        admitters.insert(0, SheddableAdmitter(detector.admit))
    d = Director(ds, load_scheduler(None, rng=random.Random(seed)), DirectorConfig(), clock=clock,
                 router=svc.router, admitters=admitters, observers=[passive], probe=passive.probe_for, flow=flow)
    return Rig(d, passive, clock, flow)


def chat(chars: int, n: int) -> bytes:
    return orjson.dumps({"model": "llama", "max_tokens": 8,
                         "messages": [{"role": "user", "content": f"{n} " + "q" * chars}]})


def headers(objective: str, slo_ms: int) -> dict[str, str]:
    h = {":path": PATH, ":method": "POST"}
    if objective:
        h["x-llm-d-inference-objective"] = objective
    if slo_ms:
        h["x-llm-d-slo-ttft-ms"] = str(slo_ms)
    return h


def explain_request(hdrs: dict[str, str], body: bytes) -> api.ExplainRequest:
    return api.ExplainRequest(path=PATH, body=body, headers={k: v for k, v in hdrs.items() if not k.startswith(":")})


def explain(r: Rig, hdrs: dict[str, str], body: bytes) -> api.ExplainResponse:
    """The synchronous explain (the dashboard's)."""
    return PointsmanService(r.director, r.passive).explain(explain_request(hdrs, body))


def real(r: Rig, hdrs: dict[str, str], body: bytes):
    ex = r.director.exchange()
    return ex, ex.decide(hdrs, body, {})


def same(info: api.ExplainResponse, out) -> None:
    """The explained outcome is the real one: queued, or the same status, endpoint and reason."""
    if isinstance(out, asyncio.Future):
        assert info.queued and info.queue, f"queued for real, explained as {info.status} {info.error!r}"
        return
    assert isinstance(out, Outcome)
    assert not info.queued, f"explained as queued ({info.queue}), but really {out.reject_status}"
    assert info.status == (out.reject_status or 200)
    assert info.error == out.reject_body
    assert info.endpoint == dict(out.set_headers).get(DESTINATION, "")


step = st.tuples(
    st.sampled_from(["", "batch", "chat"]),  # objective: default 0, sheddable -1, critical 5
    st.sampled_from([0, 0, 1, 60_000]),  # TTFT objective ms: none, unattainable, attainable
    st.integers(0, 1200),  # prompt characters (the rate limit allows about 4800 a minute)
    st.sampled_from(["keep", "keep", "close", "fail", "tick"]),  # what happens to it next
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flow_control=st.booleans(), seed=st.integers(0, 2**16), steps=st.lists(step, min_size=1, max_size=20))
def test_explain_answers_what_the_real_request_gets(flow_control, seed, steps):
    async def run() -> None:
        r = rig(flow_control, seed)
        waiting = []
        for n, (objective, slo_ms, chars, then) in enumerate(steps):
            hdrs, body = headers(objective, slo_ms), chat(chars, n)
            if n % 2:  # the gRPC API's explain, which may wait (it does not need to here)
                info = await PointsmanService(r.director, r.passive).explain_async(explain_request(hdrs, body))
            else:
                info = explain(r, hdrs, body)
            ex, out = real(r, hdrs, body)
            same(info, out)
            event("queued" if isinstance(out, asyncio.Future) else f"{info.status} {info.error[:60]}")
            if r.passive.awaiting_probe:
                event("a probe pending")
            if isinstance(out, asyncio.Future):
                waiting.append((ex, out))
                continue
            if out.reject_status:
                ex.close()
            elif then == "keep":
                r.kept.append(ex)
            else:  # answered: a 503 ejects the endpoint; after its cool-down (a tick) a probe is due
                ex.response_headers({":status": "503" if then == "fail" else "200"}, {})
                ex.response_body(b"{}", True)
                ex.close()
            if then == "tick":
                r.clock.t += 6.0  # cool-downs end: ejected endpoints wait for their probe
                r.passive.tick()
                if len(r.kept) > 1:
                    r.kept.pop(0).close()  # capacity frees
        for ex, fut in waiting:
            fut.cancel()
            ex.close()
        for ex in r.kept:
            ex.close()
        if r.flow is not None:
            await r.flow.close()

    asyncio.run(run())


# ---- the two cases that differed before explain ran the exchange's own stages ------------------------------------
def test_a_sheddable_request_with_an_unattainable_slo_is_shed_in_explain_as_for_real():
    r = rig(False, 1)
    hdrs, body = headers("batch", 1), chat(100, 0)
    info = explain(r, hdrs, body)
    ex, out = real(r, hdrs, body)
    assert out.reject_status == 429 and "objectives" in out.reject_body
    assert info.status == 429 and info.error == out.reject_body and not info.endpoint
    assert info.candidates  # what it saw on the way
    ex.close()
    assert r.director.datastore.inflight.view() == {}


def test_a_pending_probe_takes_the_request_in_explain_as_for_real():
    r = rig(False, 1, tokens_per_minute=100_000)
    d = r.director
    for n in range(12):  # a 503 ejects the endpoint that answered it
        ex, out = real(r, headers("", 0), chat(10, n))
        ex.response_headers({":status": "503"}, {})
        ex.response_body(b"{}", True)
        ex.close()
        if d.datastore.ejected:
            break
    (ejected,) = d.datastore.ejected
    # While it is out, a long prompt is served elsewhere: the scheduler's prefix affinity now prefers that endpoint.
    warm, _ = real(r, headers("", 0), chat(6000, 100))
    assert warm.result.primary.key != ejected
    warm.response_headers({":status": "200"}, {})
    warm.response_body(b"{}", True)
    warm.close()
    r.clock.t += 6.0
    r.passive.tick()
    assert r.passive.awaiting_probe == {ejected}
    before = explain(r, headers("", 0), chat(6000, 100))
    assert before.endpoint == ejected, "explain names the endpoint the probe goes to, whatever the scores say"
    assert r.passive.awaiting_probe == {ejected}, "explaining takes no probe"
    ex, out = real(r, headers("", 0), chat(6000, 100))
    assert dict(out.set_headers)[DESTINATION] == ejected == before.endpoint
    assert not r.passive.awaiting_probe  # the real request is the probe
    after = explain(r, headers("", 0), chat(6000, 100))
    assert after.status == 200 and after.endpoint == warm.result.primary.key  # one probe at a time: the scores again
    ex.close()
