"""Recorded decisions: a fixed, seeded workload through the shell's request path gives the recorded outcomes.

The workload runs through the same seam Envoy's streams use (an exchange per request: decide, the response
phases, close) under an injected clock, with real schedulers (the built-in default, GIE's weights), route
documents (Kthena's example, LLMKube's example) and malformed requests. Every outcome (status, headers set and
removed, metadata, rewritten body) is compared with `recorded_decisions.json`.

The record was taken before the shell redesign; a change that moves a single decision fails here. Re-record only for
a deliberate routing change, and say why in the commit:

    RECORD_DECISIONS=1 .venv/bin/python -m pytest tests/request/test_recorded_decisions.py
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp.fleet.datastore import Datastore, PoolSpec
from scheduling.types import Endpoint, Metrics, endpoint_key

ROOT = Path(__file__).resolve().parents[2]
RECORD = Path(__file__).with_name("recorded_decisions.json")
PROFILES = ROOT / "deploy" / "profiles"
KTHENA = ROOT / "deploy" / "examples" / "kthena" / "routes.yaml"
LLMKUBE = ROOT / "deploy" / "examples" / "llmkube" / "modelrouter.yaml"


class Clock:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Rig:
    """What the workload drives: a factory of exchanges, the datastore behind it, its clock."""

    exchange: Callable[[], Any]
    ds: Datastore
    clock: Clock


# ---- building the shell (the only part that follows the shell's construction API) ------------------------------
def _director(ds: Datastore, clock: Clock, scheduler: Any, router: Any = None, observers: tuple = ()) -> Any:
    from epp.request.director import Director, DirectorConfig

    return Director(ds, scheduler, DirectorConfig(fallbacks=1), clock=clock, router=router, observers=observers)


def _scheduler(config: Path | None, seed: int) -> Any:
    from scheduling.config import load_scheduler

    return load_scheduler(config, rng=random.Random(seed), timer=lambda: 0.0)


def plain_rig(config: Path | None) -> Rig:
    clock, ds = Clock(), Datastore(default_pool="pool")
    ds.set_pool(PoolSpec("pool"), [_ep(i) for i in range(8)])
    sched = _scheduler(config, 11)
    ds.on_endpoint_removed(sched.endpoint_removed)
    d = _director(ds, clock, sched)
    return Rig(d.exchange, ds, clock)


def session_rig() -> Rig:
    """The default profile with agent sessions identified (as `epp serve` runs it): the session case."""
    from epp.request.sessions import SessionIdentity
    from epp.request.settings import SessionSettings

    clock, ds = Clock(), Datastore(default_pool="pool")
    ds.set_pool(PoolSpec("pool"), [_ep(i) for i in range(8)])
    sched = _scheduler(None, 13)
    ds.on_endpoint_removed(sched.endpoint_removed)
    sessions = SessionIdentity(SessionSettings())
    from epp.request.director import Director, DirectorConfig

    d = Director(ds, sched, DirectorConfig(fallbacks=1), clock=clock, observers=(sessions,), sessions=sessions)
    return Rig(d.exchange, ds, clock)


def routed_rig(path: Path, pools: dict[str, list[str]] | None = None) -> Rig:
    from epp.routing.service import RoutingService

    clock, ds = Clock(), Datastore()
    for name, addresses in (pools or {}).items():
        ds.set_pool(PoolSpec(name=name, namespace="default"),
                    [_ep(i, a.split(":")[0], int(a.split(":")[1])) for i, a in enumerate(addresses)])
    svc = RoutingService(ds, random.Random(3))
    svc.load_text(path.read_text(), path.name)
    sched = _scheduler(None, 12)
    router = svc.router
    runtime = router.runtime("llmkube")
    runtime.clock = clock  # quarantine timers and latency windows run on the director's clock
    d = _director(ds, clock, sched, router=router, observers=(runtime,))
    return Rig(d.exchange, ds, clock)


# ---- the fleet -----------------------------------------------------------------------------------------------
def _ep(i: int, address: str | None = None, port: int = 8000) -> Endpoint:
    addr = address or f"10.1.0.{i + 1}"
    return Endpoint(endpoint_key(addr, port), addr, port, f"pod-{i}", "default", {},
                    metrics=_metrics(i, 0, 5000.0))


def _metrics(i: int, step: int, now: float) -> Metrics:
    r = random.Random(i * 7919 + step)
    return Metrics(waiting=r.randrange(0, 4), running=r.randrange(0, 12), kv_usage=round(r.random() * 0.9, 2),
                   updated_at=now)


# ---- the workload ----------------------------------------------------------------------------------------------
SYSTEMS = [f"You are assistant {g}. " * (20 + 13 * g) for g in range(6)]


def requests(seed: int, n: int, models: list[str]) -> Iterator[tuple[dict[str, str], bytes | None, str]]:
    """(headers, body, what happens to it): a mix of chat, completions, embeddings, Anthropic, bad input."""
    r = random.Random(seed)
    for i in range(n):
        model = r.choice(models)
        group = r.randrange(len(SYSTEMS))
        user = f"question {r.randrange(40)}: " + "x" * r.randrange(0, 900)
        headers = {":method": "POST", "x-request-id": f"req-{seed}-{i}", "content-type": "application/json"}
        kind = r.random()
        if kind < 0.55:
            headers[":path"] = "/v1/chat/completions"
            body = orjson.dumps({"model": model, "messages": [{"role": "system", "content": SYSTEMS[group]},
                                                              {"role": "user", "content": user}],
                                 "max_tokens": r.randrange(16, 400)})
        elif kind < 0.7:
            headers[":path"] = "/v1/completions"
            body = orjson.dumps({"model": model, "prompt": SYSTEMS[group] + user})
        elif kind < 0.78:
            headers[":path"] = "/v1/messages"
            body = orjson.dumps({"model": model, "system": SYSTEMS[group], "max_tokens": 100,
                                 "messages": [{"role": "user", "content": user}]})
        elif kind < 0.84:
            headers[":path"] = "/v1/embeddings"
            body = orjson.dumps({"model": model, "input": user})
        elif kind < 0.88:
            headers[":path"] = "/v1/chat/completions"
            headers["x-user-tier"] = r.choice(["premium", "free"])
            headers["user-type"] = r.choice(["premium", "standard"])
            headers["x-canary"] = r.choice(["1", "0"])
            headers["x-llmkube-classification"] = r.choice(["pii", "public"])
            body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": user}]})
        elif kind < 0.91:
            headers[":path"] = "/v1/chat/completions"
            body = b'{"model": "' + model.encode() + b'", "messages": ['  # malformed JSON
        elif kind < 0.93:
            headers[":path"] = "/v1/chat/completions"
            body = orjson.dumps({"messages": [{"role": "user", "content": user}]})  # no model
        elif kind < 0.95:
            headers[":path"] = "/v1/chat/completions"
            headers["x-gateway-destination-endpoint"] = "6.6.6.6:80"  # a client never picks its upstream
            body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": user}]})
        else:
            headers[":path"] = "/v1/chat/completions"
            headers["x-session-id"] = f"s{r.randrange(5)}"
            body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": user}], "user": "u1"})
        fate = r.choice(["ok", "ok", "ok", "open", "fail", "stream"])
        yield headers, body, fate


def outcome_record(out: Any) -> dict[str, Any]:
    if out.reject_status:
        return {"reject": out.reject_status, "body": out.reject_body, "headers": sorted(out.reject_headers or [])}
    return {
        "set": sorted((k, v) for k, v in out.set_headers),
        "remove": sorted(out.remove_headers),
        "metadata": {ns: dict(sorted(v.items())) for ns, v in (out.metadata or {}).items()},
        "body": out.body.decode() if out.body else None,
        "clear_route_cache": out.clear_route_cache,
    }


def run(rig: Rig, seed: int, n: int, models: list[str]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    held: list[Any] = []
    r = random.Random(seed + 1)
    for i, (headers, body, fate) in enumerate(requests(seed, n, models)):
        rig.clock.t += r.choice([0.01, 0.05, 0.2])
        if i % 25 == 24:  # the engines report new state
            rig.ds.update_metrics({e.key: _metrics(j, i, rig.clock.t)
                                   for j, e in enumerate(rig.ds.all_endpoints())})
        if i == n // 2 and rig.ds.snapshot("pool") is not None:  # an endpoint leaves, a new one comes
            snap = rig.ds.snapshot("pool")
            assert snap is not None
            eps = [e for e in snap.endpoints if e.address != "10.1.0.3"] + [_ep(20)]
            rig.ds.set_endpoints("pool", eps)
        ex = rig.exchange()
        out = ex.decide(headers, body, {})
        assert not hasattr(out, "__await__"), "the recorded workload decides synchronously"
        records.append(outcome_record(out))
        if out.reject_status:
            ex.close()
            continue
        if fate == "open":
            held.append(ex)
            continue
        rig.clock.t += 0.3 + r.random()
        status = "500" if fate == "fail" else "200"
        ex.response_headers({":status": status, "content-type": "text/event-stream" if fate == "stream" else
                             "application/json"}, {})
        if fate == "stream":
            ex.response_body(b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', False)
            rig.clock.t += 0.5
            ex.response_body(b'data: {"usage":{"prompt_tokens":120,"completion_tokens":30}}\n\ndata: [DONE]\n\n',
                             True)
        else:
            ex.response_body(b'{"usage":{"prompt_tokens":100,"completion_tokens":20}}', True)
        ex.close()
        if len(held) > 6:
            held.pop(0).close()
    for ex in held:
        ex.close()
    assert not rig.ds.inflight.view(), "every in-flight ticket is released"
    return records


CASES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "default-profile": lambda: run(plain_rig(None), 1, 160, ["m", "m", "other"]),
    "default-profile-sessions": lambda: run(session_rig(), 5, 160, ["m", "m", "other"]),
    "gie-profile": lambda: run(plain_rig(PROFILES / "gie-default.yaml"), 2, 120, ["m"]),
    "kthena-routes": lambda: run(routed_rig(KTHENA), 3, 100, ["deepseek-r1", "deepseek-r1", "nope"]),
    "llmkube-router": lambda: run(
        routed_rig(LLMKUBE, {"qwen3-coder": ["10.2.0.1:8080", "10.2.0.2:8080"], "llama": ["10.3.0.1:8080"]}),
        4, 100, ["qwen3-coder", "llama", "auto"]),
}


def test_recorded_decisions_are_unchanged() -> None:
    got = {name: case() for name, case in CASES.items()}
    if os.environ.get("RECORD_DECISIONS"):
        RECORD.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    want = json.loads(RECORD.read_text())
    for name in CASES:
        assert len(got[name]) == len(want[name]), name
        for i, (g, w) in enumerate(zip(got[name], want[name], strict=True)):
            assert json.loads(json.dumps(g)) == w, f"{name} request {i}"
