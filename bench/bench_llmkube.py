"""LLMKube ModelRouter micro-benchmark (not a test): the director's cost per request, decision and response path.

Each case decides the same chat request over 8 static endpoints and then feeds the response path (headers, one body
chunk with usage, close), so the quarantine watcher and budget settling are included:
  pool-rr     a plain endpoints pool scheduled by the RoundRobin balancing scheduler, no routing layer (the floor)
  default     a ModelRouter: three rules that miss, then the default route (RoundRobin)
  pii         the first rule matches the classification header (fail-closed, local)
  weighted    a weighted rule over two backends (a fallback pod listed for Envoy)
  loadaware   the default route on a LoadAware backend with prefix and session affinity
  budgets     the default route with a router budget and a team budget (a local limiter)
Rounds are interleaved; each round times `iters` requests. Reported: the median per-request time over the rounds,
and its ratio to `pool-rr`.

    python bench/bench_llmkube.py [--rounds 15] [--iters 2000]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402
import yaml  # noqa: E402
from micro import interleave  # noqa: E402

from epp.fleet.datastore import Datastore, PoolSpec  # noqa: E402
from epp.ratelimit import Limiter  # noqa: E402
from epp.ratelimit.budgets import BudgetGate  # noqa: E402
from epp.ratelimit.gate import RateLimitGate  # noqa: E402
from epp.request.director import Director  # noqa: E402
from epp.routing.dialects.llmkube.balance import balancing_scheduler  # noqa: E402
from epp.routing.dialects.llmkube.model import Balancing  # noqa: E402
from epp.routing.service import RoutingService  # noqa: E402
from scheduling.types import Endpoint, endpoint_key  # noqa: E402

EPS = {"svc-a": [f"10.0.0.{i}" for i in range(1, 5)], "svc-b": [f"10.0.0.{i}" for i in range(5, 9)]}


def datastore() -> Datastore:
    ds = Datastore()
    for name, ips in EPS.items():
        ds.set_pool(PoolSpec(name), [Endpoint(endpoint_key(ip, 8000), ip, 8000) for ip in ips])
    return ds


def router(balancing: dict | None = None, budgets: list | None = None) -> str:
    a = {"name": "a", "inferenceServiceRef": {"name": "svc-a"}, "weight": 3}
    if balancing:
        a.update(resolution="endpoint", balancing=balancing)
    return yaml.safe_dump({"apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelRouter",
                           "metadata": {"name": "r"}, "spec": {
        "backends": [a, {"name": "b", "inferenceServiceRef": {"name": "svc-b"}}],
        "rules": [{"name": "pii", "match": {"dataClassification": ["pii", "phi"]}, "route": {"backends": ["a"]},
                   "failClosed": True},
                  {"name": "hard", "match": {"taskComplexity": "complex", "models": ["qwen-*"]},
                   "route": {"backends": ["b", "a"]}},
                  {"name": "canary", "match": {"headers": {"x-canary": "1"}},
                   "route": {"backends": ["a", "b"], "strategy": "weighted"}}],
        "defaultRoute": "a", "policy": {"budgets": budgets or []}}})


def director(text: str | None) -> Director:
    ds = datastore()
    if text is None:
        sched = balancing_scheduler(Balancing(), random.Random(1), "bench")
        ds.remove_pool("svc-b")
        return Director(ds, sched)
    svc = RoutingService(ds, random.Random(1))
    svc.load_text(text, "bench")
    rate = RateLimitGate(Limiter())
    budgets = BudgetGate(rate)
    budgets.sync(svc.router.table.objects("llmkube"))
    return Director(ds, balancing_scheduler(Balancing(), random.Random(1), "unused"), router=svc.router,
                    gates=[rate, budgets], watchers=[svc.router.runtime("llmkube")])


USAGE = b'{"usage": {"prompt_tokens": 80, "completion_tokens": 20}}'
RESP = {":status": "200", "content-type": "application/json"}


def run(d: Director, headers: dict, body: bytes, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        ex = d.exchange()
        out = ex.decide(headers, body, {})
        ex.response_headers(RESP, {})
        ex.response_body(USAGE, True)
        ex.close()
    assert out.reject_status == 0, out.reject_body
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hello " * 50}]})
    base = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json",
            "x-request-id": "r"}
    budgets = [{"name": "all", "scope": "router", "maxTokens": 10**12, "windowSeconds": 3600},
               {"name": "team", "scope": "team", "maxTokens": 10**12, "windowSeconds": 60}]
    cases = {
        "pool-rr": (director(None), base),
        "default": (director(router()), base),
        "pii": (director(router()), {**base, "x-llmkube-classification": "pii"}),
        "weighted": (director(router()), {**base, "x-canary": "1"}),
        "loadaware": (director(router({"mode": "LoadAware", "prefixAffinity": {},
                                       "sessionAffinity": {"headers": ["x-session-id"]}})),
                      {**base, "x-session-id": "s1"}),
        "budgets": (director(router(budgets=budgets)), {**base, "x-llmkube-team": "red"}),
    }
    interleave(cases, a.rounds, lambda d, headers: run(d, headers, body, a.iters), floor="pool-rr")


if __name__ == "__main__":
    main()
