"""Admission gates in the director: a Kthena route's token rate limit refuses with 429 + headers, holds are refunded
when scheduling fails after admission and settled when the stream ends, shared limits make the decision awaitable,
and a client that goes away while waiting leaves nothing charged."""

from __future__ import annotations

import asyncio
import inspect
import random

import orjson
import pytest

from epp.api.metrics import RequestMetrics
from epp.fleet.datastore import Datastore
from epp.protocol import Outcome
from epp.ratelimit import Limiter, RedisStore
from epp.ratelimit.gate import RateLimitGate
from epp.request.director import Director, DirectorConfig
from epp.routing.service import RoutingService
from scheduling.config import load_scheduler
from tests.support.redis_server import RedisServer

ROUTES = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: a}
spec:
  inferenceEngine: vLLM
  workloadPort: {port: 8000}
  endpoints: [{name: a0, address: 10.0.0.1}]
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: limited}
spec:
  modelName: llama
  rateLimit: {inputTokensPerUnit: 100, unit: minute@GLOBAL@}
  rules:
  - {name: x, targetModels: [{modelServerName: a}]}
"""
HDRS = {":path": "/v1/chat/completions", ":method": "POST"}


def body(chars: int) -> bytes:
    return orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "x" * chars}]})


class Metrics:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def request_started(self, *a: object) -> None: ...
    def request_finished(self, *a: object) -> None: ...
    def scheduler_duration(self, *a: object) -> None: ...
    def plugin_duration(self, *a: object) -> None: ...
    def disagg_decision(self, *a: object) -> None: ...
    def scheduler_attempt(self, *a: object) -> None: ...

    def request_error(self, model: str, target: str, code: str, *twin_labels: object) -> None:
        self.errors.append(code)


def director(global_limit: str = "", store: RedisStore | None = None) -> tuple[Director, Limiter, Metrics]:
    ds = Datastore()
    svc = RoutingService(ds, random.Random(1))
    svc.load_text(ROUTES.replace("@GLOBAL@", global_limit), "routes.yaml")
    assert not svc.documents.errors, svc.documents.errors
    limiter = Limiter(redis=store)
    metrics = Metrics()
    d = Director(ds, load_scheduler(None, rng=random.Random(1)), DirectorConfig(), router=svc.router,
                 admitters=[RateLimitGate(limiter)], observers=[RequestMetrics(metrics)])  # type: ignore[arg-type]
    return d, limiter, metrics


def remaining(limiter: Limiter) -> float:
    """Input tokens left (the bucket refills at 100 per minute, so compare with a small tolerance)."""
    states = [s for s in limiter.snapshot() if s.metric == "input_tokens"]
    return states[0].remaining if states else 100.0


def test_over_the_limit_is_a_429_with_rate_limit_headers():
    d, limiter, metrics = director()
    ex = d.exchange()
    out = ex.decide(HDRS, body(4 * 60), {})  # 60 tokens of 100
    assert isinstance(out, Outcome) and not out.reject_status
    ex.close()
    ex2 = d.exchange()
    refused = ex2.decide(HDRS, body(4 * 60), {})  # 60 more do not fit
    assert isinstance(refused, Outcome) and refused.reject_status == 429
    headers = dict(refused.reject_headers)
    assert "retry-after" in headers and "x-ratelimit-remaining" in headers and "x-ratelimit-limit" in headers
    assert refused.reject_body.startswith("inference error: ResourceExhausted")
    ex2.close()
    assert metrics.errors == ["ResourceExhausted"]
    assert d.datastore.inflight.view() == {}


def test_a_request_refused_after_admission_gets_its_charge_back():
    d, limiter, metrics = director()
    d.datastore.objectives = {"batch": -1}
    before = remaining(limiter)
    # Admitted (the rate limit charges its prompt's tokens), then shed when scheduled: a sheddable request whose 1 ms
    # TTFT objective no endpoint is predicted to meet (epp/request/commit.py slo_refusal).
    shed = {**HDRS, "x-llm-d-inference-objective": "batch", "x-llm-d-slo-ttft-ms": "1"}
    ex = d.exchange()
    out = ex.decide(shed, body(4 * 50), {})
    assert isinstance(out, Outcome) and out.reject_status == 429 and "objectives" in out.reject_body
    ex.close()
    assert metrics.errors == ["ResourceExhausted"]
    assert remaining(limiter) == pytest.approx(before, abs=0.5)  # the charge came back
    ex = d.exchange()  # the same request within reach of its objective is routed and keeps its charge
    out = ex.decide({**shed, "x-llm-d-slo-ttft-ms": "60000"}, body(4 * 50), {})
    assert isinstance(out, Outcome) and not out.reject_status
    assert before - remaining(limiter) >= 50  # its prompt's estimate: what the refused one was charged too
    ex.close()


def test_the_stream_end_settles_the_charge_once():
    d, limiter, _ = director()
    ex = d.exchange()
    ex.decide(HDRS, body(4 * 40), {})
    left = remaining(limiter)
    ex.close()
    ex.close()
    assert remaining(limiter) == pytest.approx(left, abs=0.5)  # no usage seen: the input charge stays, once


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer()
    server.start()
    yield server
    server.stop()


async def test_a_shared_limit_makes_the_decision_awaitable(redis_server):
    store = RedisStore(redis_server.url, timeout_s=0.5)
    d, limiter, _ = director(f", global: {{redis: {{address: '{redis_server.address}'}}}}", store)
    try:
        ex = d.exchange()
        pending = ex.decide(HDRS, body(4 * 60), {})
        assert inspect.isawaitable(pending)
        out = await pending
        assert not out.reject_status
        ex.close()
        ex2 = d.exchange()
        out2 = await ex2.decide(HDRS, body(4 * 60), {})
        assert out2.reject_status == 429
        ex2.close()
        # A client that goes away while admission waits: cancelled, nothing held, in-flight untouched.
        left = remaining(limiter)
        redis_server.pause()  # admission now waits on Redis
        try:
            ex3 = d.exchange()
            pending = ex3.decide(HDRS, body(4 * 10), {})
            assert inspect.isawaitable(pending)
            task = asyncio.ensure_future(pending)
            await asyncio.sleep(0.05)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            ex3.close()
        finally:
            redis_server.resume()
        assert d.datastore.inflight.view() == {}
        assert remaining(limiter) == pytest.approx(left, abs=0.5)  # the 10 tokens were not charged
    finally:
        await limiter.close()
