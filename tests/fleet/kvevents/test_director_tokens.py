"""The director tokenizes a request only when the deciding config reads token ids, at once when it can (prompt ids,
a loaded local tokenizer, the engine tokenizer's cache), through an awaitable decision otherwise (a tokenizer to
load, the engine's /tokenize), and falls back to the approximation when the engine is dead."""

from __future__ import annotations

import asyncio
import inspect
import random
from pathlib import Path

import orjson

from epp.api.explain import PointsmanService
from epp.api.pb import pointsman_pb2 as api
from epp.fleet.datastore import Datastore, PoolSpec
from epp.protocol import Outcome
from epp.request.director import Director
from epp.tokenize import EngineTokenizer, RequestTokenizer, TokenizerRegistry
from epp.tokenize.shell import RequestTokens
from scheduling.config import load_scheduler
from scheduling.types import Endpoint, endpoint_key
from tests.support.envoy import free_port
from tests.support.tiny_tokenizer import build_tokenizer

MODEL = "acme/tiny-chat"
HDRS = {":path": "/v1/chat/completions", ":method": "POST"}
PRECISE = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
           "plugins": [{"type": "precise-prefix-cache-scorer"}, {"type": "max-score-picker"}],
           "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "precise-prefix-cache-scorer"},
                                                                   {"pluginRef": "max-score-picker"}]}]}


def body(text: str = "What is the capital of France?") -> bytes:
    return orjson.dumps({"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "system", "content": "You are a helpful assistant. " * 8}, {"role": "user", "content": text}]})


def director_for(urls: list[str], config: object, tokenizer: RequestTokenizer) -> Director:
    ds = Datastore()
    eps = []
    for u in urls:
        host, port = u.rsplit("//", 1)[1].rsplit(":", 1)
        eps.append(Endpoint(endpoint_key(host, int(port)), host, int(port), models=frozenset({MODEL})))
    ds.set_pool(PoolSpec("pool"), eps)
    d = Director(ds, load_scheduler(config, rng=random.Random(0)), tokens=RequestTokens(tokenizer))
    return d


async def decide(d: Director, raw: bytes) -> tuple[bool, Outcome]:
    """(the decision had to be awaited, its outcome)"""
    ex = d.exchange()
    out = ex.decide(HDRS, raw, {})
    waited = inspect.isawaitable(out)
    if waited:
        out = await out
    assert isinstance(out, Outcome) and not out.reject_status, out
    ex.close()
    return waited, out


async def test_the_default_profile_is_never_tokenized(make_fleet):
    fleet = await make_fleet(1, model=MODEL)
    rt = RequestTokenizer(None, EngineTokenizer())
    d = director_for(fleet.urls, None, rt)
    try:
        waited, _ = await decide(d, body())
        assert not waited and sum(rt.counts.values()) == 0 and rt.engine is not None and rt.engine.misses == 0
    finally:
        await rt.engine.close()  # type: ignore[union-attr]


async def test_engine_tokenize_makes_the_decision_awaitable_then_its_cache_does_not(make_fleet):
    fleet = await make_fleet(2, model=MODEL)
    eng = EngineTokenizer()
    rt = RequestTokenizer(None, eng)
    d = director_for(fleet.urls, PRECISE, rt)
    try:
        waited, _ = await decide(d, body())
        assert waited and rt.counts["engine"] == 1 and eng.misses == 1
        waited, _ = await decide(d, body())  # same prompt: the engine tokenizer's cache answers at once
        assert not waited and rt.counts["engine"] == 2 and eng.hits >= 1
        # explain reports the source and the real token count (and counts nothing)
        resp = await PointsmanService(d).explain_async(api.ExplainRequest(path=HDRS[":path"], body=body()))
        assert resp.status == 200 and resp.token_source == "engine"
        assert resp.prompt_tokens == len(eng.lookup(MODEL, messages=orjson.loads(body())["messages"]) or [])
        assert rt.counts["engine"] == 2
        assert {m.source for m in resp.prefix} == {"approximate"}  # no KV events subscribed here
    finally:
        await eng.close()


async def test_a_local_tokenizer_is_loaded_once_then_used_at_once(make_fleet, tmp_path: Path):
    build_tokenizer(tmp_path / MODEL)
    fleet = await make_fleet(1, model=MODEL)
    rt = RequestTokenizer(TokenizerRegistry(root=tmp_path), None)
    d = director_for(fleet.urls, PRECISE, rt)
    waited, _ = await decide(d, body())
    assert waited and rt.counts["local"] == 1  # loaded in a worker thread
    waited, _ = await decide(d, body("Write a haiku about routers and caches."))
    assert not waited and rt.counts["local"] == 2


async def test_a_dead_engine_falls_back_to_the_approximation_and_is_backed_off():
    dead = f"http://127.0.0.1:{free_port()}"
    eng = EngineTokenizer(timeout=0.5)
    rt = RequestTokenizer(None, eng)
    d = director_for([dead], PRECISE, rt)
    try:
        waited, out = await decide(d, body())
        assert waited and rt.counts["approx"] == 1 and eng.errors.get("connection") == 1
        assert ("x-gateway-destination-endpoint", dead.rsplit("//", 1)[1]) in out.set_headers
        waited, _ = await decide(d, body("another question"))
        assert not waited and rt.counts["approx"] == 2  # backed off: no second call, no wait
    finally:
        await eng.close()


async def test_a_client_leaving_cancels_the_tokenization_and_commits_nothing(make_fleet):
    fleet = await make_fleet(1, model=MODEL)
    eng = EngineTokenizer()
    rt = RequestTokenizer(None, eng)
    d = director_for(fleet.urls, PRECISE, rt)
    try:
        ex = d.exchange()
        pending = ex.decide(HDRS, body(), {})
        assert inspect.isawaitable(pending)
        task = asyncio.ensure_future(pending)
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        ex.close()
        assert task.cancelled() and d.datastore.inflight.view() == {}
    finally:
        await eng.close()
