"""Routing-layer micro-benchmark (not a test): the director's cost per request with and without routes.

Four ways to route the same chat request over the same 8 static endpoints, with the same trivial scheduler (the
first candidate), so the difference is the routing layer alone:
  pool      an endpoints pool, no routing layer (the floor)
  route     a ModelRoute: a header rule that misses, then a 70/30 split over two ModelServers (model overwrite)
  sticky    the same ModelServers with sessionSticky (header source) and retries 1
  provider  a rule sending the request to an ExternalModelProvider (credential, path, header stripping)
Rounds are interleaved (pool, route, sticky, provider, pool, ...); each round times `iters` decide()+close() calls.
Reported: the median per-request time over the rounds, and its ratio to `pool`.

    python bench/bench_routing.py [--rounds 15] [--iters 2000]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402
from micro import interleave  # noqa: E402

from epp.fleet.datastore import Datastore, PoolSpec  # noqa: E402
from epp.request.director import Director  # noqa: E402
from epp.routing.service import RoutingService  # noqa: E402
from scheduling.api import SchedulingContext, SchedulingResult  # noqa: E402
from scheduling.types import Endpoint, endpoint_key  # noqa: E402

HEAD = "apiVersion: networking.serving.volcano.sh/v1alpha1\n"


class First:
    def schedule(self, ctx: SchedulingContext, *, dry_run: bool = False) -> SchedulingResult:
        return SchedulingResult(targets=[ctx.candidates[0]])

    def pre_request(self, ctx, result):  # noqa: ANN001
        pass

    def response_complete(self, ctx, result):  # noqa: ANN001
        pass

    def endpoint_removed(self, key):  # noqa: ANN001
        pass


def servers(sticky: bool) -> str:
    policy = ("  trafficPolicy:\n    retry: {attempts: 1}\n    sessionSticky:\n      sources: "
              "[{type: Header, name: x-session-id}]\n") if sticky else ""
    out = ""
    for name, base in (("v1", 1), ("v2", 5)):
        eps = ", ".join(f"{{name: e{i}, address: 10.0.0.{i}}}" for i in range(base, base + 4))
        out += (f"{HEAD}kind: ModelServer\nmetadata: {{name: {name}}}\nspec:\n  model: real-model\n"
                f"  inferenceEngine: vLLM\n  workloadPort: {{port: 8000}}\n  endpoints: [{eps}]\n{policy}---\n")
    return out


ROUTE = HEAD + """kind: ModelRoute
metadata: {name: r}
spec:
  modelName: m
  rules:
  - name: premium
    modelMatch: {headers: {x-tier: {exact: premium}}}
    targetModels: [{modelServerName: v2}]
  - name: cloud
    modelMatch: {headers: {x-cloud: {exact: "1"}}}
    targetModels: [{externalModelProviderName: p}]
  - name: split
    targetModels: [{modelServerName: v1, weight: 70}, {modelServerName: v2, weight: 30}]
---
""" + HEAD + """kind: ExternalModelProvider
metadata: {name: p}
spec: {baseURL: 'https://api.example.com/v1', model: up, auth: {secretRef: {name: k, key: t}}, headers: {x-o: a}}
"""


def director(kind: str, secrets: str) -> Director:
    ds = Datastore()
    if kind == "pool":
        eps = [Endpoint(endpoint_key(f"10.0.0.{i}", 8000), f"10.0.0.{i}", 8000) for i in range(1, 9)]
        ds.set_pool(PoolSpec("pool"), eps)
        return Director(ds, First())
    svc = RoutingService(ds, random.Random(1), secrets_dir=secrets)
    svc.load_text(servers(kind == "sticky") + ROUTE, "bench")
    return Director(ds, First(), router=svc.router)


def run(d: Director, headers: dict, body: bytes, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        ex = d.exchange()
        out = ex.decide(headers, body, {})
        ex.close()
    assert out.reject_status == 0, out.reject_body
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    (Path(tmp) / "k").mkdir()
    (Path(tmp) / "k" / "t").write_text("secret")
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hello " * 50}]})
    base = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json",
            "authorization": "Bearer client", "x-request-id": "r"}
    cases = {
        "pool": (director("pool", tmp), base),
        "route": (director("route", tmp), base),
        "sticky": (director("sticky", tmp), {**base, "x-session-id": "s1"}),
        "provider": (director("route", tmp), {**base, "x-cloud": "1"}),
    }
    interleave(cases, a.rounds, lambda d, headers: run(d, headers, body, a.iters), floor="pool")


if __name__ == "__main__":
    main()
