"""Shadow profiles: another config decides the same requests after the reply, nothing acts on it; the report
(agreement, predicted against realised latency, where traffic would move) on /metrics and the dashboard API; the
hot reload; the budget."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from epp.observe.shadow import Budget
from tests.observe.test_tracing_otlp import request
from tests.support.envoy import free_port
from tests.support.stack import serve_args
from tests.support.wait import until

EPS = ("pools:\n- name: pool\n  endpoints:\n"
       "  - {address: 10.0.0.1, port: 8000, models: [llama], labels: {tier: a}}\n"
       "  - {address: 10.0.0.2, port: 8000, models: [llama], labels: {tier: b}}\n"
       "  - {address: 10.0.0.3, port: 8000, models: [llama], labels: {tier: b}}\n")


def tier(value: str) -> str:
    """A config that only ever picks among the endpoints of one tier, by estimated latency."""
    return f"""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: by-label-filter
  parameters: {{label: tier, validValues: [{value}]}}
- type: estimated-latency-scorer
- type: max-score-picker
schedulingProfiles:
- name: tier-{value}
  plugins:
  - pluginRef: by-label-filter
  - pluginRef: estimated-latency-scorer
  - pluginRef: max-score-picker
"""


@pytest.fixture
async def shadowed(tmp_path):
    from epp.cmd.app import App

    (tmp_path / "eps.yaml").write_text(EPS)
    (tmp_path / "live.yaml").write_text(tier("a"))
    (tmp_path / "shadow.yaml").write_text(tier("b"))
    mport = free_port()
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(tmp_path / "eps.yaml"),
                         "--config-file", str(tmp_path / "live.yaml"), "--shadow-config",
                         str(tmp_path / "shadow.yaml"), "--metrics-port", str(mport)))
    await app.start()
    try:
        yield app, mport, tmp_path
    finally:
        await app.stop(0)


async def test_the_shadow_decides_without_acting_and_reports(shadowed):
    app, mport, tmp = shadowed
    shadow = app.observe.shadow
    for _ in range(6):
        assert await request(app.port) == "10.0.0.1:8000"  # the live config alone routes
    await until(lambda: shadow.report.timed == 6, 10.0)
    r = shadow.report
    assert (r.agree, r.disagree) == (0, 6)
    assert {k: (c.live, c.shadow) for k, c in r.endpoints.items() if c.live or c.shadow}.keys() <= {
        "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
    assert r.endpoints["10.0.0.1:8000"].live == 6 and r.endpoints["10.0.0.1:8000"].shadow == 0
    assert sum(r.endpoints[k].shadow for k in ("10.0.0.2:8000", "10.0.0.3:8000")) == 6
    # The shadow's model estimated its own picks; the live pick (filtered out of the shadow's tier) by the live one.
    assert r.predicted_shadow > 0 and r.timed_live == 6 and r.predicted_live > 0 and r.realised_live > 0
    assert app.datastore.inflight.view() == {}  # the shadow's picks were never counted in flight
    # The receipt names the shadow's pick; the metrics and the dashboard report the same numbers.
    rec = app.recorder.find(1, app.director.clock())
    assert rec.shadow in ("10.0.0.2:8000", "10.0.0.3:8000")
    async with aiohttp.ClientSession() as c:
        async with c.get(f"http://127.0.0.1:{mport}/metrics") as resp:
            text = await resp.text()
        async with c.get(f"http://127.0.0.1:{mport}/api/shadow") as resp:
            view = await resp.json()
    assert 'pointsman_shadow_decisions_total{result="disagree"} 6.0' in text
    assert 'pointsman_shadow_picks_total{endpoint="10.0.0.1:8000",scheduler="live"} 6.0' in text
    assert "pointsman_shadow_agreement_ratio 0.0" in text
    assert view["enabled"] and view["agreement"] == 0.0 and view["disagreements_timed"] == 6
    assert view["predicted_shadow_ms"] > 0 and view["realised_live_ms"] > 0
    assert {m["from"] for m in view["moves"]} == {"10.0.0.1:8000"}
    # A new shadow config is picked up (hot reload) with a fresh report.
    (tmp / "shadow.yaml").write_text(tier("a") + "\n# now the same tier\n")
    await until(lambda: shadow.report is not r, 15)
    for _ in range(3):
        await request(app.port)
    await until(lambda: shadow.report.shadowed == 3, 10.0)
    assert (shadow.report.agree, shadow.report.disagree) == (3, 0)


async def test_a_bad_shadow_config_keeps_the_old_one(shadowed):
    app, _, tmp = shadowed
    shadow = app.observe.shadow
    before = shadow.scheduler
    (tmp / "shadow.yaml").write_text("kind: EndpointPickerConfig\nplugins: [{type: no-such-plugin}]\n")
    watcher = app.observe.watcher
    await until(lambda: watcher.failures == 1, 15)
    assert shadow.scheduler is before
    await request(app.port)
    await until(lambda: shadow.report.shadowed == 1, 10.0)


def test_the_budget_samples_under_load():
    b = Budget(rate=10.0, max_cpu=0.5, now=0.0)
    taken = [b.take(0.0) for _ in range(15)]
    assert taken.count("") == 10 and taken.count("rate") == 5  # a second's worth of burst, then the rate
    assert b.take(0.1) == ""  # 0.1 s refills one
    b.charge(0.5)
    assert b.take(0.2) == "cpu"  # half of this second already spent
    assert b.take(1.2) == ""  # a new second


async def test_under_a_tight_rate_the_shadow_samples_and_counts_the_rest(tmp_path):
    from epp.cmd.app import App

    (tmp_path / "eps.yaml").write_text(EPS)
    (tmp_path / "shadow.yaml").write_text(tier("b"))
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(tmp_path / "eps.yaml"),
                         "--shadow-config", str(tmp_path / "shadow.yaml"), "--shadow-rate", "2"))
    await app.start()
    try:
        await asyncio.gather(*(request(app.port) for _ in range(8)))
        report = app.observe.shadow.report
        await until(lambda: report.shadowed + report.skipped.get("rate", 0) == 8, 10.0)
        assert report.skipped["rate"] >= 5 and 1 <= report.shadowed <= 3
    finally:
        await app.stop(0)


async def test_the_shadow_runs_after_the_reply_is_flushed(shadowed, monkeypatch):
    """The transport flushes a decision's replies in a callback it schedules after the decision (epp/h2grpc/
    outbound.py); the shadow's run waits for the turn after, and its learning counts against the CPU budget."""
    from epp.observe.shadow import ShadowRun

    app, _, _ = shadowed
    order: list[str] = []
    execute = ShadowRun.execute
    monkeypatch.setattr(ShadowRun, "execute", lambda run: (order.append("shadow"), execute(run))[1])
    loop = asyncio.get_running_loop()
    ex = app.director.exchange()
    headers = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json"}
    outcome = ex.decide(headers, b'{"model": "llama", "messages": [{"role": "user", "content": "hi"}]}', {})
    assert not outcome.reject_status
    loop.call_soon(order.append, "flush")  # what sending the replies schedules
    for _ in range(3):
        await asyncio.sleep(0)
    assert order == ["flush", "shadow"]
    shadow = app.observe.shadow
    spent = shadow.report.cpu_seconds
    ex.response_headers({":status": "200"}, {})
    ex.close()
    assert shadow.report.cpu_seconds > spent and shadow.report.ended == 1  # the learning was charged
