"""Pointsman's own API over real gRPC: Explain (dry run, with per-plugin detail) and ListEndpoints, and the CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc
import orjson
import pytest

from epp.api.pb import pointsman_pb2 as api
from epp.api.pb import pointsman_pb2_grpc
from tests.support.envoy import free_port
from tests.support.stack import serve_args

ROOT = Path(__file__).resolve().parents[2]
BODY = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture
async def app(tmp_path):
    from epp.cmd.app import App

    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: pool\n  endpoints:\n"
                   "  - {address: 10.0.0.1, port: 8000, models: [llama]}\n"
                   "  - {address: 10.0.0.2, port: 8000, models: [llama]}\n"
                   "  - {address: 10.0.0.3, port: 8000, models: [other]}\n")
    a = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps)))
    await a.start()
    yield a
    await a.stop(0)


async def test_explain_returns_the_decision_with_plugin_detail(app):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:
        stub = pointsman_pb2_grpc.PointsmanStub(ch)
        resp = await stub.Explain(api.ExplainRequest(path="/v1/chat/completions", body=BODY))
        assert resp.status == 200, resp.error
        assert resp.endpoint in ("10.0.0.1:8000", "10.0.0.2:8000")
        assert set(resp.candidates) == {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
        assert resp.headers["x-gateway-destination-endpoint"] == resp.endpoint
        run = resp.profiles[0]
        scorers = {p.type: p for p in run.plugins if p.kind == "scorer"}
        assert set(scorers) == {"estimated-latency-scorer", "agent-session-scorer"}  # the built-in default profile
        assert not resp.HasField("session")  # the request names no session
        assert all(0.0 <= v <= 1.0 for p in scorers.values() for v in p.scores.values())
        assert set(run.totals) == {"10.0.0.1:8000", "10.0.0.2:8000"}  # only endpoints serving the model
        # A dry run commits nothing.
        assert app.datastore.inflight.view() == {}
        bad = await stub.Explain(api.ExplainRequest(path="/v1/chat/completions", body=b"{"))
        assert bad.status == 400 and bad.error.startswith("inference error: BadRequest")
        listing = await stub.ListEndpoints(api.ListEndpointsRequest())
        assert [e.key for e in listing.endpoints] == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
        assert listing.default_pool == "pool" and listing.endpoints[0].metrics_age_seconds == -1.0


async def test_explain_and_endpoints_commands(app):
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "epp.cmd.cli", *argv], capture_output=True, text=True, cwd=ROOT,
                              timeout=60)

    res = await asyncio.to_thread(run, "explain", "--addr", f"127.0.0.1:{app.port}", "--body", BODY.decode())
    assert res.returncode == 0, res.stderr
    assert "endpoint  10.0.0." in res.stdout and "scorer" in res.stdout
    res = await asyncio.to_thread(run, "explain", "--addr", f"127.0.0.1:{app.port}", "--json", "--body",
                                  BODY.decode())
    assert json.loads(res.stdout)["status"] == 200
    res = await asyncio.to_thread(run, "endpoints", "--addr", f"127.0.0.1:{app.port}")
    rows = [line.split() for line in res.stdout.splitlines()[1:]]
    assert res.returncode == 0 and [r[1] for r in rows] == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
    assert all(r[8] in ("healthy", "out") for r in rows), res.stdout  # the state column


async def test_explain_shows_the_session_its_turn_and_why(app):
    session_body = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "plan " * 400}],
                                 "user": "agent-7"})
    ex = app.director.exchange()  # turn 1, committed as Envoy's stream would
    out = ex.decide({":path": "/v1/chat/completions", ":method": "POST"}, session_body, {})
    home = dict(out.set_headers)["x-gateway-destination-endpoint"]
    ex.close()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:
        stub = pointsman_pb2_grpc.PointsmanStub(ch)
        resp = await stub.Explain(api.ExplainRequest(path="/v1/chat/completions", body=session_body))
    s = resp.session
    assert resp.HasField("session") and s.source == "user" and s.turn == 2 and s.bound == home
    assert s.decision == "stayed" and resp.endpoint == home and s.warm_seconds > 0 and len(s.id) == 12
    assert "agent-7" not in str(resp)  # the value itself never leaves the process
    from epp.api.client import format_explain

    text = format_explain(resp)
    assert f"turn 2   context on {home}" in text and "stayed" in text


def test_generated_proto_code_matches_the_proto(tmp_path):
    from grpc_tools import protoc

    assert protoc.main(["protoc", f"-Iepp/api/pb={ROOT / 'proto'}", f"--python_out={tmp_path}",
                        f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                        str(ROOT / "proto" / "pointsman.proto")]) == 0
    for name in ("pointsman_pb2.py", "pointsman_pb2_grpc.py", "pointsman_pb2.pyi"):
        generated = tmp_path / "epp" / "api" / "pb" / name
        assert generated.read_text() == (ROOT / "epp" / "api" / "pb" / name).read_text(), (
            f"epp/api/pb/{name} is stale: regenerate with grpc_tools.protoc (see proto/README.md)")


async def test_explain_is_a_true_dry_run(tmp_path):
    """Explain changes nothing: no metrics, no counters, no plugin state, not even the random sequence; so it
    shows exactly the decision the next real request gets."""
    from epp.cmd.app import App

    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: pool\n  endpoints:\n"
                   + "".join(f"  - {{address: 10.0.0.{i}, port: 8000}}\n" for i in range(1, 5)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("""apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: prefix-cache-scorer}
- {type: no-hit-lru-scorer}
- {type: session-affinity-scorer}
- {type: estimated-latency-scorer}
- {type: random-picker}
""")
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps), "--config-file", str(cfg),
                         "--metrics-port", "0", "--seed", "7"))
    await app.start()
    try:
        sched = app.director.scheduler
        prompt = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "q" * 900}]})
        headers = {":path": "/v1/chat/completions", "x-session-id": "s1"}
        before_metrics = _without_health(app.metrics.exposition())
        before_rng = sched.fallback.rng.getstate()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:
            stub = pointsman_pb2_grpc.PointsmanStub(ch)
            picks = []
            for _ in range(3):
                resp = await stub.Explain(api.ExplainRequest(path="/v1/chat/completions", body=prompt,
                                                             headers={"x-session-id": "s1"}))
                assert resp.status == 200, resp.error
                picks.append(resp.endpoint)
        assert len(set(picks)) == 1  # the random picker's sequence did not move
        assert _without_health(app.metrics.exposition()) == before_metrics
        assert sched.fallback.rng.getstate() == before_rng
        assert sched.tracked_endpoints() == set() and sched.decision_counts == {}
        assert app.datastore.inflight.view() == {}
        # The next real decision is the one explain showed.
        ex = app.director.exchange()
        out = ex.decide(headers, prompt, {})
        assert dict(out.set_headers)["x-gateway-destination-endpoint"] == picks[0]
        ex.close()
        assert sched.tracked_endpoints() == {picks[0]}
    finally:
        await app.stop(0)


def _without_health(exposition: bytes) -> list[bytes]:
    """The exposition minus the endpoint health gauges, which follow the (failing) scrapes over time."""
    return [line for line in exposition.splitlines() if b"pointsman_endpoint_" not in line]


async def test_explain_and_endpoints_show_the_latency_model(app):
    """Fitted timings (from two scrapes of engine histograms), their source and age, and the prefix trust, in
    explain (per candidate, with this request's predicted TTFT and TPOT and its SLO verdict) and in ListEndpoints."""
    from scheduling.types import EngineTotals, Metrics

    ds = app.datastore
    key = "10.0.0.1:8000"
    now = app.director.clock()
    for i, at in enumerate((now - 0.1, now)):  # the engine decoded 100 tokens at 6 ms each, alone
        totals = EngineTotals(ttft=(0.0, 0.0), itl=(0.6 * i, 100.0 * i), prompt_tokens=0.0, cached_tokens=0.0,
                              requests=0.0)
        ds.update_metrics({key: Metrics(running=1, stale=False, updated_at=at, engine=totals)})
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:
        stub = pointsman_pb2_grpc.PointsmanStub(ch)
        headers = {"x-llm-d-slo-ttft-ms": "2000", "x-llm-d-slo-tpot-ms": "8"}
        resp = await stub.Explain(api.ExplainRequest(path="/v1/chat/completions", body=BODY, headers=headers))
        assert resp.status == 200, resp.error
        models = {m.endpoint: m for m in resp.models}
        assert set(models) == {"10.0.0.1:8000", "10.0.0.2:8000"}
        fitted, other = models[key], models["10.0.0.2:8000"]
        assert fitted.timings == "engine" and abs(fitted.inter_token_seconds - 0.006) < 1e-9
        assert 0 <= fitted.fitted_age_seconds < 5
        assert other.timings == "pool" and other.fitted_age_seconds == -1  # the fitted endpoints' mean
        assert fitted.trust == "approximate" and fitted.hit_belief == 1.0  # no KV events here
        # its engine runs one request (the scraped gauge): one more slows the decode by 1/15
        assert fitted.predicted_ttft_seconds > 0 and abs(fitted.predicted_tpot_seconds - 0.006 * 16 / 15) < 1e-9
        assert resp.slo == "ttft 2000 ms, tpot 8 ms" and resp.slo_attainable and fitted.meets_slo
        listing = await stub.ListEndpoints(api.ListEndpointsRequest())
        by_key = {e.key: e for e in listing.endpoints}
        assert by_key[key].model.timings == "engine" and by_key[key].model.trust == "approximate"
    exposition = app.metrics.exposition().decode()
    assert (f'pointsman_endpoint_timing_seconds{{endpoint="{key}",source="engine",timing="inter_token"}} 0.006'
            in exposition)
    assert f'pointsman_endpoint_prefix_trust{{endpoint="{key}",state="approximate"}} 1.0' in exposition
    from epp.api.client import format_explain

    text = format_explain(resp)
    assert "slo       ttft 2000 ms, tpot 8 ms (placed as tight): attainable" in text  # the only class seen
    room = fitted.ttft_headroom_seconds
    assert resp.slo_class == "tight" and abs(room - (2.0 - fitted.predicted_ttft_seconds)) < 1e-9
    assert abs(fitted.tpot_headroom_seconds - (0.008 - fitted.predicted_tpot_seconds)) < 1e-9
    assert f"headroom ttft {room * 1e3:+.0f}ms, tpot " in text
    assert "engine " in text and "6.0ms/tok" in text and "s ago)" in text


@pytest.mark.parametrize("transport", ["h2", "grpcio"])
async def test_explain_and_endpoints_speak_tls_to_a_tls_port(tmp_path, transport):
    """`epp serve` serves TLS by default: the clients see it and trust the certificate the port presents."""
    from epp.cmd.app import App

    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: pool\n  endpoints:\n  - {address: 10.0.0.1, port: 8000, models: [llama]}\n")
    a = App(serve_args("--secure-serving=true", "--grpc-transport", transport, "--grpc-port", str(free_port()),
                       "--endpoints-file", str(eps)))
    await a.start()
    try:
        def run(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "epp.cmd.cli", *argv], capture_output=True, text=True,
                                  cwd=ROOT, timeout=60)

        res = await asyncio.to_thread(run, "explain", "--addr", f"127.0.0.1:{a.port}", "--json", "--body",
                                      BODY.decode())
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["endpoint"] == "10.0.0.1:8000"
        res = await asyncio.to_thread(run, "endpoints", "--addr", f"127.0.0.1:{a.port}")
        assert res.returncode == 0 and "10.0.0.1:8000" in res.stdout, res.stderr
    finally:
        await a.stop(0)
