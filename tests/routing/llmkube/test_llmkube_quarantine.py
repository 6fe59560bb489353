"""Quarantine from the response path: two 5xx (or network failures) in a row skip a pod, one skips an external
backend, a stream silent past streamIdleTimeout skips it at once; after quarantineDuration one half-open probe
decides. (The end-to-end version through Envoy and modelsim is test_llmkube_envoy_e2e.py.)"""

from __future__ import annotations

import asyncio

from llmkube_helpers import Clock, Rig, cloud, finish, local, router_doc, served

from epp.routing.dialects.llmkube.quarantine import FailureTracker, LatencyWindow, StreamWatch
from tests.support.wait import until

PODS = ["10.0.0.1:8000", "10.0.0.2:8000"]


def test_two_failures_in_a_row_quarantine_a_key_and_a_success_resets_the_count():
    t = FailureTracker(quarantine_s=15)
    t.failure("k", 0.0, "HTTP 500")
    assert t.available("k", 0.0)
    t.success("k")
    t.failure("k", 1.0, "HTTP 500")
    assert t.available("k", 1.0) and len(t) == 1  # the success reset the count
    t.failure("k", 2.0, "HTTP 503")
    assert not t.available("k", 2.0) and t.state("k", 16.9) == "quarantined"
    assert t.quarantined(3.0) == [("k", 14.0, "HTTP 503")]


def test_half_open_allows_exactly_one_probe_whose_answer_decides():
    t = FailureTracker(quarantine_s=10)
    t.failure("k", 0.0, "x", at_once=True)
    assert t.state("k", 10.0) == "half-open" and t.available("k", 10.0)
    t.begin("k", 10.0)  # the probe goes
    assert t.state("k", 10.5) == "probing" and not t.available("k", 10.5)
    t.failure("k", 11.0, "HTTP 500")  # one failure during the probe: quarantined again at once
    assert t.state("k", 11.0) == "quarantined" and t.state("k", 20.9) == "quarantined"
    t.begin("k", 21.0)
    t.abandon("k")  # the probe's client went away: the next request probes
    assert t.available("k", 21.5)
    t.begin("k", 21.5)
    t.success("k")
    assert t.state("k", 22.0) == "healthy" and len(t) == 0


def test_a_response_from_a_fallback_counts_against_the_primary():
    clock = Clock(0.0)
    t = FailureTracker(10)
    for _ in range(2):
        w = StreamWatch(t, "p", threshold=2, clock=clock, fallbacks=("f",))
        w.response_headers(200, "f")  # Envoy retried on the fallback, which answered
        w.closed()
    assert t.state("p", 0.0) == "quarantined" and t.state("f", 0.0) == "healthy"


async def test_a_silent_stream_quarantines_at_once_and_a_chatty_one_never():
    t = FailureTracker(10)
    real = asyncio.get_running_loop().time
    w = StreamWatch(t, "slow", threshold=2, clock=real, idle_s=0.15)
    w.response_headers(200)
    for _ in range(4):  # bytes every 0.05 s: never idle for 0.15 s
        await asyncio.sleep(0.05)
        w.response_chunk(False)
    assert t.state("slow", real()) == "healthy"
    silent_from = w.last  # silence from here
    await until(lambda: t.state("slow", real()) == "quarantined", 5, "the silent stream to be quarantined")
    assert real() - silent_from >= 0.149  # not before the idle timeout (0.15 s)
    w.closed()
    w2 = StreamWatch(t, "quick", threshold=2, clock=real, idle_s=0.02)
    w2.response_headers(200)
    w2.response_chunk(True)
    w2.closed()
    assert w2.timer is None
    # A window in which nothing may happen: past the quick stream's idle timeout (0.02 s) with room to spare, a
    # timer left behind would have fired by now.
    await asyncio.sleep(0.06)
    assert t.state("quick", real()) == "healthy" and w2.timer is None


def test_a_proxy_idle_timeout_that_beats_our_timer_still_counts_as_silent():
    """Envoy's stream idle timeout and the watch's timer have the same length: whichever fires first, a stream
    silent that long quarantines at once (Envoy's 504, or the reset stream), while a quick 5xx counts once."""
    clock = Clock(0.0)
    t = FailureTracker(10)
    w = StreamWatch(t, "a", threshold=2, clock=clock, idle_s=1.0)  # no loop: no timer of its own
    clock.t = 1.0
    w.response_headers(504)  # Envoy's local reply after its idle timeout
    assert t.state("a", 1.0) == "quarantined"
    w2 = StreamWatch(t, "b", threshold=2, clock=clock, idle_s=1.0)
    clock.t = 2.0
    w2.closed()  # or the proxy just reset the stream
    assert t.state("b", 2.0) == "quarantined"
    w3 = StreamWatch(t, "c", threshold=2, clock=clock, idle_s=1.0)
    clock.t = 2.2
    w3.response_headers(503)  # a quick 5xx: one failure of two
    w4 = StreamWatch(t, "d", threshold=2, clock=clock, idle_s=1.0)
    w4.closed()  # a client that went away at once: abandoned, not silent
    assert t.state("c", 2.2) == "healthy" and t.state("d", 2.2) == "healthy"


def test_latency_window_p95():
    lw = LatencyWindow(size=100, max_age_s=60)
    for i in range(100):
        lw.add("b", float(i), 0.0)
    assert lw.p95("b", 1.0) == 94.0 and lw.p95("b", 61.0) is None and lw.p95("x", 0.0) is None


def rig(**proxy) -> Rig:
    r = Rig(router_doc({"backends": [local("a", "svc"), cloud("gpt")], "defaultRoute": "a",
                        "rules": [{"name": "cloud", "match": {"headers": {"x-cloud": "1"}},
                                   "route": {"backends": ["gpt", "a"]}}],
                        "proxy": {"quarantineDuration": "2s", **proxy}}), {"svc": PODS})
    assert not r.errors, r.errors
    return r


def test_a_pod_is_skipped_after_two_5xx_in_a_row_and_probed_after_the_duration():
    r = rig()
    bad = PODS[0]
    fails = 0
    while fails < 2:  # round robin alternates; fail only the bad pod's responses
        ex, out = r.decide()
        if served(out) == bad:
            finish(ex, status=500)
            fails += 1
        else:
            finish(ex)
    for _ in range(4):
        ex, out = r.decide()
        assert served(out) == PODS[1]
        finish(ex)
    assert r.explain().endpoint == PODS[1]
    r.clock.t += 2.0  # half-open: one probe
    seen = []
    for _ in range(3):
        ex, out = r.decide()
        seen.append(served(out))
        if served(out) == bad:
            held = ex  # the probe is in flight: nobody else goes there
        else:
            finish(ex)
    assert seen.count(bad) == 1
    finish(held)  # the probe succeeds
    seen = []
    for _ in range(4):
        ex, out = r.decide()
        seen.append(served(out))
        finish(ex)
    assert seen.count(bad) == 2


def test_an_external_backend_is_skipped_after_one_failure(tmp_path):
    (tmp_path / "k").mkdir()
    r = Rig(router_doc({"backends": [local("a", "svc"), cloud("gpt", external={"credentialsSecretRef": {"name": "k"}})],
                        "rules": [{"name": "cloud", "route": {"backends": ["gpt", "a"]}}],
                        "proxy": {"quarantineDuration": "2s"}}), {"svc": PODS}, secrets_dir=str(tmp_path))
    (tmp_path / "k" / "OPENAI_API_KEY").write_text("sk-1")
    ex, out = r.decide()
    assert dict(out.set_headers).get("x-pointsman-provider") == "provider.default.r.gpt"
    finish(ex, status=502)
    _, out = r.decide()
    assert served(out) in PODS  # primary-fallback moved on to the local backend
    r.clock.t += 2.5
    ex, out = r.decide()
    assert dict(out.set_headers).get("x-pointsman-provider")  # the half-open probe
    finish(ex)
    _, out = r.decide()
    assert dict(out.set_headers).get("x-pointsman-provider")


def test_a_4xx_is_not_a_failure_and_lean_phases_see_nothing():
    r = rig()
    for _ in range(6):
        ex, out = r.decide()
        finish(ex, status=429)
    for _ in range(6):
        ex, out = r.decide()
        ex.close()  # lean phases: only the end of the stream
    assert r.runtime.tracker.quarantined(r.clock()) == []
