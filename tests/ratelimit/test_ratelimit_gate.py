"""The director's side: Kthena ModelRoutes loaded by the real routing layer, their `rateLimit` admitted through
the gate, the 429 Outcome, and settling from a response's usage as the director scans it."""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Iterator

import orjson
import pytest

from epp.fleet.datastore import Datastore
from epp.ratelimit import Limit, Limiter, RedisStore
from epp.ratelimit.gate import RateLimitGate
from epp.request.director import Director, DirectorConfig
from epp.request.resolve import resolve
from epp.request.usage import UsageScanner
from epp.routing.service import RoutingService
from scheduling.config import load_scheduler
from tests.support.redis_server import RedisServer

SERVER = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: a}
spec:
  inferenceEngine: vLLM
  workloadPort: {port: 8000}
  endpoints: [{name: a0, address: 10.0.0.1}]
"""


def route(name: str, model: str, rate: str = "") -> str:
    return f"""---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {{name: {name}}}
spec:
  modelName: {model}
{rate}  rules:
  - {{name: x, targetModels: [{{modelServerName: a}}]}}
"""


def director(text: str) -> Director:
    ds = Datastore()
    svc = RoutingService(ds, random.Random(1))
    svc.load_text(text, "routes.yaml")
    assert not svc.documents.errors, svc.documents.errors
    return Director(ds, load_scheduler(None, rng=random.Random(1)), DirectorConfig(), router=svc.router)


def ctx_for(d: Director, model: str, **body: object) -> tuple[object, dict]:
    raw = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hello there"}], **body})
    ctx, parsed = resolve(d, {":path": "/v1/chat/completions", ":method": "POST"}, raw, {})
    return ctx, parsed or {}


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    srv.stop()


def test_a_kthena_route_limits_input_tokens_with_kthenas_words() -> None:
    d = director(SERVER + route("limited", "m", "  rateLimit:\n    inputTokensPerUnit: 10\n"
                                               "    outputTokensPerUnit: 5000\n    unit: minute\n"))
    gate = RateLimitGate(Limiter())
    ctx, body = ctx_for(d, "m")
    first = gate.charge(ctx, 7, body)
    assert not inspect.isawaitable(first) and first.allowed and first.ticket is not None
    refused = gate.charge(ctx, 7, body)
    assert not inspect.isawaitable(refused) and not refused.allowed
    out = gate.rejection(refused)
    assert out.reject_status == 429
    assert out.reject_body.startswith('inference error: ResourceExhausted - input token rate limit exceeded: '
                                      '"ModelRoute/default/limited" allows 10 input tokens per minute')
    h = dict(out.reject_headers)
    assert h["retry-after"] == "24" and h["x-ratelimit-remaining"] == "3"
    assert h["x-ratelimit-limit"] == ('10, 10;w=60;name="ModelRoute/default/limited", '
                                      '5000;w=60;name="ModelRoute/default/limited"')


def test_routes_are_counted_apart_and_a_route_without_limits_is_free() -> None:
    d = director(SERVER + route("one", "m1", "  rateLimit: {inputTokensPerUnit: 10}\n")
                 + route("two", "m2", "  rateLimit: {inputTokensPerUnit: 10}\n") + route("free", "m3"))
    gate = RateLimitGate(Limiter())
    for model in ("m1", "m2"):
        ctx, body = ctx_for(d, model)
        assert gate.charge(ctx, 10, body).allowed  # type: ignore[union-attr]
        assert not gate.charge(ctx, 1, body).allowed  # type: ignore[union-attr]
    ctx, body = ctx_for(d, "m3")
    free = gate.charge(ctx, 10**6, body)
    assert free.allowed and free.ticket is None  # type: ignore[union-attr]


def test_output_is_settled_from_usage_or_kept_at_max_tokens_in_lean_phases() -> None:
    d = director(SERVER + route("out", "m", "  rateLimit: {outputTokensPerUnit: 1000, unit: hour}\n"))
    limiter = Limiter()
    gate = RateLimitGate(limiter, default_output_tokens=0)
    ctx, body = ctx_for(d, "m", max_tokens=300)
    full = gate.charge(ctx, 5, body)
    scanner = UsageScanner("application/json")  # what the director scans in full response phases
    scanner.feed(orjson.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 42}}), True)
    gate.settle(full.ticket, scanner.usage)  # type: ignore[union-attr]
    assert {r.metric: r.used for r in limiter.snapshot()}["output_tokens"] == pytest.approx(42, abs=0.1)
    lean = gate.charge(ctx, 5, body)
    gate.settle(lean.ticket, None)  # lean phases: no usage is ever seen, max_tokens stays charged
    assert {r.metric: r.used for r in limiter.snapshot()}["output_tokens"] == pytest.approx(342, abs=0.1)
    ctx, body = ctx_for(d, "m")  # no max_tokens: the configured default (0)
    gate.settle(gate.charge(ctx, 5, body).ticket, None)  # type: ignore[union-attr]
    assert {r.metric: r.used for r in limiter.snapshot()}["output_tokens"] == pytest.approx(342, abs=0.1)


def test_a_global_route_is_shared_through_redis(redis_server: RedisServer) -> None:
    text = SERVER + route("shared", "m", "  rateLimit:\n    inputTokensPerUnit: 100\n    unit: day\n"
                                         f"    global: {{redis: {{address: '{redis_server.address}'}}}}\n")

    async def main() -> None:
        replicas = [RateLimitGate(Limiter(redis=RedisStore(redis_server.address, timeout_s=2.0))) for _ in range(2)]
        d = director(text)
        ctx, body = ctx_for(d, "m")
        pending = replicas[0].charge(ctx, 60, body)
        assert inspect.isawaitable(pending)  # a shared limit: Redis is asked
        first = await pending
        assert first.allowed and not first.degraded
        second = await replicas[1].charge(ctx, 60, body)  # type: ignore[misc]
        assert not second.allowed and dict(second.headers)["x-ratelimit-remaining"] == "40"
        for g in replicas:
            await g.limiter.close()

    asyncio.run(main())


def test_dry_run_for_explain_charges_nothing_and_extra_limits_join() -> None:
    d = director(SERVER + route("r", "m", "  rateLimit: {inputTokensPerUnit: 10, unit: day}\n"))
    gate = RateLimitGate(Limiter())
    budget = Limit.rolling("team-cap", "total_tokens", 20, 3600)
    ctx, body = ctx_for(d, "m")
    assert gate.charge(ctx, 10, body, dry_run=True).allowed  # type: ignore[union-attr]
    adm = gate.charge(ctx, 10, body, extra=[(budget, "team-a")])
    assert adm.allowed and len(adm.statuses) == 2  # type: ignore[union-attr]
    assert not gate.charge(ctx, 1, body, dry_run=True).allowed  # type: ignore[union-attr]
