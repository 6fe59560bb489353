"""Helpers for the routing tests: a director with the routing layer, from route documents."""

from __future__ import annotations

import random
from pathlib import Path

import orjson

from epp.fleet.datastore import Datastore
from epp.request.director import Director, DirectorConfig
from epp.routing.service import RoutingService
from scheduling.api import SchedulingContext, SchedulingResult

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "kthena" / "routes.yaml"
HDRS = {":path": "/v1/chat/completions", ":method": "POST"}


class LeastLoaded:
    """Least in-flight first, then by key: deterministic, honours the candidates it is given."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def schedule(self, ctx: SchedulingContext, *, dry_run: bool = False) -> SchedulingResult:
        self.seen.append([e.key for e in ctx.candidates])
        eps = sorted(ctx.candidates, key=lambda e: (ctx.load(e).requests, e.key))
        return SchedulingResult(targets=eps, profile="test")

    def pre_request(self, ctx, result):
        pass

    def response_complete(self, ctx, result):
        pass

    def endpoint_removed(self, key):
        pass


def routed(text: str, *, seed: int = 1, ds: Datastore | None = None, secrets_dir: str | None = None,
           scheduler=None, clock=None) -> tuple[Director, RoutingService]:
    ds = ds or Datastore()
    rng = random.Random(seed)
    svc = RoutingService(ds, rng, secrets_dir=secrets_dir)
    svc.load_text(text, "routes.yaml")
    kw = {"clock": clock} if clock is not None else {}
    d = Director(ds, scheduler or LeastLoaded(), DirectorConfig(), router=svc.router, **kw)
    return d, svc


def chat(model: str, **extra) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], **extra})


def decide(director: Director, model: str = "deepseek-r1", headers: dict | None = None, body: bytes | None = None,
           path: str | None = None):
    ex = director.exchange()
    h = {**HDRS, **(headers or {})}
    if path:
        h[":path"] = path
    out = ex.decide(h, chat(model) if body is None else body, {})
    return ex, out


def hdrs(outcome) -> dict[str, str]:
    return dict(outcome.set_headers)
