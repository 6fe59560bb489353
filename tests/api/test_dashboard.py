"""The dashboard over real HTTP: Pointsman in-process behind a real Envoy, requests through Envoy, the page's APIs,
server-sent events, explain as a dry run, the bearer token, the path prefix and the shipped assets."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path

import aiohttp
import orjson
import pytest

from epp.api.dashboard.web import CSP, _load_static
from epp.api.explain import PointsmanService
from epp.api.pb import pointsman_pb2 as api
from epp.cmd.app import App
from tests.support.envoy import free_port
from tests.support.stack import Stack, serve_args
from tests.support.wait import until

CHAT = {"model": "llama", "messages": [{"role": "user", "content": "Tell me about the sea. " * 8}]}
TOKEN = "s3cret-dashboard-token-0123456789"


# GIE's default profile: three weighted scorers, so per-plugin detail is worth showing.
GIE_DEFAULT = Path(__file__).resolve().parents[2] / "deploy" / "profiles" / "gie-default.yaml"


@pytest.fixture
async def stack(tmp_path):
    metrics = free_port()
    s = Stack(tmp_path, epp_flags=("--metrics-port", str(metrics), "--config-file", str(GIE_DEFAULT)))
    s.metrics = metrics
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


async def start_app(tmp_path, *flags: str) -> tuple[App, str]:
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: pool\n  endpoints:\n"
                   "  - {address: 10.0.0.1, port: 8000, models: [llama]}\n"
                   "  - {address: 10.0.0.2, port: 8000, models: [llama]}\n")
    port = free_port()
    app = App(serve_args("--grpc-port", str(free_port()), "--metrics-port", str(port), "--endpoints-file", str(eps),
                         *flags))
    await app.start()
    return app, f"http://127.0.0.1:{port}"


async def events(resp: aiohttp.ClientResponse):
    """Parse a text/event-stream into (event, data) pairs."""
    event, data = "message", []
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif not line and data:
            yield event, orjson.loads("\n".join(data))
            event, data = "message", []


async def test_a_request_through_envoy_streams_to_the_page_with_scores_and_outcome(stack):
    base = f"http://127.0.0.1:{stack.metrics}"
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/api/events") as ev:
            assert ev.status == 200 and ev.headers["Content-Type"].startswith("text/event-stream")
            stream = events(ev)
            assert (await asyncio.wait_for(anext(stream), 5))[0] == "tick"
            body = orjson.dumps({**CHAT, "stream": True})
            async with s.post(stack.url + "/v1/chat/completions", data=body,
                              headers={"content-type": "application/json", "x-request-id": "dash-req-1"}) as r:
                assert r.status == 200
                text = await r.text()
            served = f"127.0.0.1:{orjson.loads(text.split('data: ')[-2])['served_by']}"
            got, outcome = None, None
            while got is None or outcome is None:
                kind, data = await asyncio.wait_for(anext(stream), 10)
                if kind in ("decisions", "outcomes"):
                    for d in data:
                        if d["id"] == "dash-req-1":
                            got = got or d
                            outcome = d if d["done"] else outcome
        assert got["endpoint"] == served and got["model"] == "llama" and got["profile"] == "default"
        assert got["runner_up"] and got["runner_up"] != served and got["margin"] is not None
        assert got["prefix"] is not None and got["decide_ms"] > 0
        assert outcome["status"] == "200" and outcome["ttft_ms"] is not None and outcome["duration_ms"] > 0
        async with s.get(f"{base}/api/decisions/{got['seq']}") as r:
            detail = await r.json()
        (run,) = detail["runs"]
        assert run["targets"][0] == served and set(run["candidates"]) == {f"127.0.0.1:{p}" for p in stack.ports}
        scorers = [p for p in run["plugins"] if p["kind"] == "scorer"]
        assert {p["type"] for p in scorers} == {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"}
        assert all(set(p["scores"]) == set(run["candidates"]) for p in scorers)
        async with s.get(base + "/api/decisions/999999") as r:
            assert r.status == 404 and "ring buffer" in (await r.json())["error"]
        async with s.get(base + "/api/fleet") as r:
            fleet = await r.json()
        assert sorted(e["key"] for e in fleet["endpoints"]) == sorted(f"127.0.0.1:{p}" for p in stack.ports)
        async with s.get(base + "/api/decisions?since=0") as r:
            listed = await r.json()
        assert [d["id"] for d in listed["decisions"]] == ["dash-req-1"] and listed["capacity"] == 500
        async def sampled() -> dict:  # the sampler ticks once a second
            async with s.get(base + "/api/series") as r:
                got = await r.json()
            return got if any(v > 0 for v in got["rate"]) and got["ttft"] else {}

        series = await until(sampled, 7.5, "a sample of the rate and TTFT", 0.25)
        assert any(v > 0 for v in series["rate"]) and list(series["ttft"]) == [served]


async def test_explain_is_the_cli_dry_run_and_changes_nothing(stack):
    base = f"http://127.0.0.1:{stack.metrics}"
    app = stack.app
    req = {"path": "/v1/chat/completions", "headers": "x-gateway-inference-objective: none\n",
           "body": orjson.dumps(CHAT).decode()}
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/metrics") as r:
            before = await r.text()
        async with s.post(base + "/api/explain", json=req) as r:
            assert r.status == 200
            out = await r.json()
        async with s.get(base + "/metrics") as r:
            after = await r.text()
        grpc_view = PointsmanService(app.director).explain(
            api.ExplainRequest(path=req["path"], body=req["body"].encode()))
        assert out["status"] == 200 and out["endpoint"] in grpc_view.candidates
        assert out["candidates"] == list(grpc_view.candidates)
        (run,) = out["profiles"]
        assert [(p["kind"], p["name"]) for p in run["plugins"]] == [(p.kind, p.name) for p in grpc_view.profiles[0].plugins]
        scorers = [p for p in run["plugins"] if p["kind"] == "scorer"]
        assert all(set(p["scores"]) == set(out["candidates"]) for p in scorers)
        assert out["text"].startswith("model 'llama' -> target 'llama'") and "scorer prefix-cache-scorer" in out["text"]
        # A dry run: nothing recorded, nothing in flight, no request counted.
        assert app.dashboard.recorder.seq == 0 and app.datastore.inflight.view() == {}
        counted = re.compile(r"^inference_objective_(request_total|running_requests)\{.*$", re.M)
        assert counted.findall(before) == counted.findall(after) == []
        # Bad input gets a clear error.
        async with s.post(base + "/api/explain", data=b"{nope") as r:
            assert r.status == 400 and "not JSON" in (await r.json())["error"]
        async with s.post(base + "/api/explain", json={**req, "headers": "no colon"}) as r:
            assert r.status == 400 and "name: value" in (await r.json())["error"]
        async with s.post(base + "/api/explain", json={**req, "body": "{"}) as r:
            bad = await r.json()
            assert r.status == 200 and bad["status"] == 400 and bad["error"].startswith("inference error: BadRequest")
        async with s.post(base + "/api/explain", data=b"x" * (2 * 1024 * 1024)) as r:
            assert r.status == 413 and "too large" in (await r.json())["error"]


async def test_the_token_protects_the_page_and_apis_but_not_metrics(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DASHBOARD_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)
    app, base = await start_app(tmp_path)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/") as r:
                page = await r.text()
                assert r.status == 401 and 'name="token"' in page and TOKEN not in page
            async with s.get(base + "/api/fleet") as r:
                assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
            async with s.get(base + "/api/fleet", headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with s.get(base + "/api/fleet", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 200 and len((await r.json())["endpoints"]) == 2
            async with s.post(base + "/api/explain", json={"body": orjson.dumps(CHAT).decode()}) as r:
                assert r.status == 401
            async with s.get(base + "/metrics") as r:
                assert r.status == 200 and "inference_pool_ready_pods" in await r.text()
            async with s.get(base + "/static/app.js") as r:
                assert r.status == 200  # the package's own code: no data behind it
            async with s.post(base + "/login", data={"token": "wrong"}, allow_redirects=False) as r:
                assert r.status == 401 and "set-cookie" not in r.headers
            async with s.post(base + "/login", data={"token": TOKEN}, allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"] == "./"
                cookie = r.cookies["pointsman_dashboard"]
                assert TOKEN not in cookie.value and cookie["httponly"] and cookie["samesite"] == "Strict"
        async with aiohttp.ClientSession(cookies={"pointsman_dashboard": cookie.value}) as s:
            async with s.get(base + "/") as r:
                assert r.status == 200 and r.headers["Content-Security-Policy"] == CSP
            async with s.get(base + "/api/config") as r:
                assert r.status == 200
    finally:
        await app.stop(0)
    assert "dashboard on port" in caplog.text and TOKEN not in caplog.text


async def test_path_prefix_moves_the_page_and_false_turns_it_off(tmp_path):
    app, base = await start_app(tmp_path, "--dashboard-path-prefix", "/pointsman")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/pointsman", allow_redirects=False) as r:
                assert r.status == 301 and r.headers["Location"] == "/pointsman/"
            async with s.get(base + "/pointsman/") as r:
                assert r.status == 200 and "Pointsman" in await r.text()
            async with s.get(base + "/pointsman/api/fleet") as r:
                assert r.status == 200
            for path in ("/", "/api/fleet"):
                async with s.get(base + path) as r:
                    assert r.status == 404
            async with s.get(base + "/metrics") as r:
                assert r.status == 200
    finally:
        await app.stop(0)
    app, base = await start_app(tmp_path, "--dashboard", "false")
    try:
        assert app.recorder is None and app.dashboard is None
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/") as r:
                assert r.status == 404
            async with s.get(base + "/metrics") as r:
                assert r.status == 200
    finally:
        await app.stop(0)
    with pytest.raises(ValueError, match="cannot be /metrics"):
        await start_app(tmp_path, "--dashboard-path-prefix", "/metrics/")


CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
metadata: {name: tuned}
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 5}
  - {pluginRef: kv-cache-utilization-scorer, weight: 1}
  - pluginRef: max-score-picker
"""


async def test_config_shows_the_effective_profile_and_the_last_reload(tmp_path):
    cfg = tmp_path / "sched.yaml"
    cfg.write_text(CONFIG)
    app, base = await start_app(tmp_path, "--config-file", str(cfg))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/api/config") as r:
                c = await r.json()
            assert c["source"] == f"file {cfg}"
            prof = c["schedulers"][0]["profiles"][0]
            assert [(x["type"], x["weight"]) for x in prof["scorers"]] == [
                ("queue-scorer", 5.0), ("kv-cache-utilization-scorer", 1.0)]
            reloads = {w["what"]: w for w in c["reloads"]}
            assert reloads["scheduling config"]["last_result"] == "ok" and reloads["endpoints"]["reloads"] == 1
            cfg.write_text(CONFIG.replace("weight: 5", "weight: -5"))
            st = os.stat(cfg)
            os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000))
            assert not await app.watchers["scheduling config"].check_once()
            async with s.get(base + "/api/config") as r:
                c = await r.json()
            w = {w["what"]: w for w in c["reloads"]}["scheduling config"]
            assert w["last_result"] == "rejected" and w["failures"] == 1 and w["last_error"]
            assert c["schedulers"][0]["profiles"][0]["scorers"][0]["weight"] == 5.0  # the old config keeps serving
    finally:
        await app.stop(0)


def test_the_page_ships_its_assets_and_loads_nothing_from_outside():
    static = _load_static()
    assert {"index.html", "login.html", "app.js", "app.css", "vendor/uplot/uPlot.iife.min.js",
            "vendor/uplot/uPlot.min.css", "vendor/uplot/LICENSE.txt"} <= set(static)
    for name in ("index.html", "login.html"):
        html = static[name][0].decode()
        refs = re.findall(r'(?:src|href)="([^"]*)"', html)
        assert refs, name
        for ref in refs:
            assert not re.match(r"^([a-z]+:)?//", ref), f"{name} loads {ref} from outside"
            assert ref == "data:," or ref.startswith("static/") and ref[7:] in static, ref
    js = static["app.js"][0].decode()
    assert "http://" not in js.replace("http://www.w3.org/2000/svg", "") and "https://" not in js
    assert "MIT" in static["vendor/uplot/LICENSE.txt"][0].decode()
