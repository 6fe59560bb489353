"""Helpers for the LLMKube tests: a director routing by a ModelRouter over standalone pools (the endpoints-file pool
of each InferenceService), with the real balancing schedulers, the budget gate and the response watchers."""

from __future__ import annotations

import random
from collections.abc import Mapping

import orjson
import yaml

from epp.fleet.datastore import Datastore, PoolSpec
from epp.ratelimit import Limiter
from epp.ratelimit.budgets import BudgetGate
from epp.ratelimit.gate import RateLimitGate
from epp.request.director import Director, DirectorConfig
from epp.routing.service import RoutingService
from scheduling.types import Endpoint, Metrics, endpoint_key

HDRS = {":path": "/v1/chat/completions", ":method": "POST"}


def router_doc(spec: dict, name: str = "r", namespace: str = "default", **meta) -> str:
    return yaml.safe_dump({"apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelRouter",
                           "metadata": {"name": name, "namespace": namespace, **meta}, "spec": spec},
                          sort_keys=False)


def local(name: str, service: str | None = None, **extra) -> dict:
    return {"name": name, "inferenceServiceRef": {"name": service or name}, **extra}


def cloud(name: str, provider: str = "openai", model: str = "gpt-x", **extra) -> dict:
    ext = {"provider": provider, "model": model, **extra.pop("external", {})}
    return {"name": name, "external": ext, **extra}


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def set_pool(ds: Datastore, name: str, addresses: list[str], metrics: Mapping[str, Metrics] | None = None) -> None:
    eps = []
    for a in addresses:
        host, port = a.rsplit(":", 1)
        eps.append(Endpoint(endpoint_key(host, int(port)), host, int(port), a, "default", {},
                            metrics=(metrics or {}).get(a, Metrics())))
    ds.set_pool(PoolSpec(name=name, namespace="default"), eps)


class Rig:
    """A director + routing service + budget gate over a ModelRouter text and standalone pools."""

    def __init__(self, text: str, pools: Mapping[str, list[str]], *, seed: int = 1, secrets_dir: str | None = None,
                 clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.ds = Datastore()
        for name, addrs in pools.items():
            set_pool(self.ds, name, addrs)
        self.svc = RoutingService(self.ds, random.Random(seed), secrets_dir=secrets_dir)
        self.svc.router.runtime("llmkube").clock = self.clock
        self.svc.load_text(text, "routes.yaml")
        self.limiter = Limiter(clock=self.clock)
        self.rate = RateLimitGate(self.limiter)
        self.budgets = BudgetGate(self.rate)
        self.budgets.sync(self.svc.router.table.objects("llmkube"))
        self.svc.on_table.append(lambda t: self.budgets.sync(t.objects("llmkube")))
        self.director = Director(self.ds, _Unused(), DirectorConfig(), router=self.svc.router, clock=self.clock,
                                 admitters=[self.rate, self.budgets], observers=[self.svc.router.runtime("llmkube")])

    @property
    def errors(self) -> dict:
        return self.svc.documents.errors

    @property
    def runtime(self):
        return next(iter(self.svc.router.runtime("llmkube").runtimes.values()))

    def decide(self, model: str = "m", headers: dict | None = None, body: dict | None = None, **extra):
        ex = self.director.exchange()
        payload = body if body is not None else {"model": model, "messages": [{"role": "user", "content": "hi"}],
                                                 **extra}
        out = ex.decide({**HDRS, **(headers or {})}, orjson.dumps(payload), {})
        return ex, out

    def explain(self, model: str = "m", headers: dict | None = None, body: dict | None = None):
        from epp.api.explain import PointsmanService
        from epp.api.pb import pointsman_pb2 as api

        payload = body if body is not None else {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        return PointsmanService(self.director).explain(api.ExplainRequest(
            path="/v1/chat/completions", headers=headers or {}, body=orjson.dumps(payload)))


class _Unused:
    """The director's own scheduler: ModelRouter backends always bring theirs, so this must never be asked."""

    def schedule(self, ctx, *, dry_run=False):
        raise AssertionError("a ModelRouter backend was scheduled by the director's default scheduler")

    def pre_request(self, ctx, result):
        pass

    def response_complete(self, ctx, result):
        pass

    def endpoint_removed(self, key):
        pass


def hdrs(outcome) -> dict[str, str]:
    return {k.lower(): v for k, v in outcome.set_headers}


def served(outcome) -> str:
    return hdrs(outcome).get("x-gateway-destination-endpoint", "")


def finish(ex, status: int = 200, chunks: int = 1) -> None:
    """The response path of one committed request: headers, body chunks, end of stream."""
    ex.response_headers({":status": str(status), "content-type": "application/json"}, {})
    for i in range(chunks):
        ex.response_body(b"{}", i == chunks - 1)
    ex.close()
