"""One formula test per scorer plugin."""

from __future__ import annotations

import base64
import math

import orjson
import pytest
from sched_helpers import ctx, ep, plugin, req, scores, state

from scheduling.api import InflightLoad
from scheduling.prefix import block_hashes


def test_queue_scorer_minmax():
    eps = [ep(1, waiting=0), ep(2, waiting=5), ep(3, waiting=10)]
    assert scores(plugin("queue-scorer"), ctx(req(), eps)) == [1.0, 0.5, 0.0]
    assert (
        scores(plugin("waiting-requests-scorer", dialect="heimdall"), ctx(req(), eps[1:2] * 3)) == [1.0] * 3
    )


def test_running_requests_scorer_minmax():
    eps = [ep(1, running=4), ep(2, running=2), ep(3, running=0)]
    assert scores(plugin("running-requests-scorer"), ctx(req(), eps)) == [0.0, 0.5, 1.0]


def test_active_request_scorer_llmd_form():
    eps = [ep(1), ep(2), ep(3)]
    infl = {eps[0].key: InflightLoad(0), eps[1].key: InflightLoad(2), eps[2].key: InflightLoad(4)}
    assert scores(plugin("active-request-scorer"), ctx(req(), eps, inflight=infl)) == [1.0, 0.5, 0.0]
    s = plugin("active-request-scorer", {"idleThreshold": 2})
    assert scores(s, ctx(req(), eps, inflight=infl)) == [1.0, 1.0, 0.0]
    assert scores(s, ctx(req(), eps)) == [1.0, 1.0, 1.0]


def test_inflight_requests_scorer_heimdall_form():
    eps = [ep(1), ep(2), ep(3)]
    infl = {eps[0].key: InflightLoad(1), eps[1].key: InflightLoad(3), eps[2].key: InflightLoad(5)}
    assert scores(plugin("inflight-requests-scorer"), ctx(req(), eps, inflight=infl)) == [1.0, 0.5, 0.0]


def test_kv_cache_utilization():
    eps = [ep(1, kv=0.0), ep(2, kv=0.25), ep(3, kv=1.0)]
    assert scores(plugin("kv-cache-utilization-scorer"), ctx(req(), eps)) == [1.0, 0.75, 0.0]
    assert (
        type(plugin("kv-utilization-scorer", dialect="heimdall")).type_name == "kv-cache-utilization-scorer"
    )


def test_heimdall_kv_block_occupancy():
    shared: dict = {}
    s = plugin("kv-cache-utilization-scorer", shared=shared, dialect="heimdall")
    assert s.type_name == "kv-block-occupancy-scorer"
    a = ep(1, num_gpu_blocks=100, block_size=16)
    b = ep(2, num_gpu_blocks=100, block_size=16)
    unknown = ep(3)
    s.prefix.index.record(a.key, list(range(1, 26)))  # 25 of 100 blocks
    got = scores(s, ctx(req(), [a, b, unknown]))
    assert got == [0.75, 1.0, 0.5]


def test_load_aware():
    eps = [ep(1, waiting=0), ep(2, waiting=64), ep(3, waiting=128), ep(4, waiting=500)]
    assert scores(plugin("load-aware-scorer"), ctx(req(), eps)) == [0.5, 0.25, 0.0, 0.0]


def test_lora_affinity_scorer():
    active = ep(1, active_loras=frozenset({"a"}), max_lora=1)
    room = ep(2, active_loras=frozenset({"b"}), max_lora=4)
    waiting = ep(3, active_loras=frozenset({"b"}), waiting_loras=frozenset({"a"}), max_lora=2)
    full = ep(4, active_loras=frozenset({"b", "c"}), max_lora=2)
    s = plugin("lora-affinity-scorer")
    assert scores(s, ctx(req(lora="a"), [active, room, waiting, full])) == [1.0, 0.8, 0.6, 0.0]
    assert scores(s, ctx(req(), [active, full])) == [1.0, 1.0]


def test_token_load():
    eps = [ep(1), ep(2), ep(3)]
    infl = {eps[1].key: InflightLoad(3, 1_048_576), eps[2].key: InflightLoad(9, 10_000_000)}
    assert scores(plugin("token-load-scorer"), ctx(req(), eps, inflight=infl)) == [1.0, 0.75, 0.0]


def test_token_length_heimdall():
    label = "mif.moreh.io/aigateway.optimal-min-tokens"
    generalist = ep(1)
    long_min = ep(2, labels={label: "4000"})
    huge_min = ep(3, labels={label: "100000"})
    s = plugin("token-length-scorer")
    long_prompt = "x" * 4 * 8000  # 8000 tokens
    got = scores(s, ctx(req(long_prompt), [generalist, long_min, huge_min]))
    assert got[1] == 1.0 and got[0] < 0.01 and 0 < got[2] < got[1]
    assert got[0] == pytest.approx((1 / 8001) / (4001 / 8001))
    short = scores(s, ctx(req("x" * 40), [generalist, long_min]))
    assert short[0] == 1.0 and short[1] == pytest.approx((0.5 * 11 / 4001) / (1 / 11))


def test_constant_scorer():
    assert scores(plugin("constant-scorer"), ctx(req(), [ep(1), ep(2)])) == [1.0, 1.0]


def test_context_length_scores():
    lbl = "llm-d.ai/context-length-range"
    tight = ep(1, labels={lbl: "0-2048"})
    wide = ep(2, labels={lbl: "0-131072"})
    out = ep(3, labels={lbl: "4096-8192"})
    plain = ep(4)
    got = scores(plugin("context-length-aware"), ctx(req("x" * 4 * 1000), [tight, wide, out, plain]))
    assert 0.3 < got[1] < got[0] <= 1.0
    assert 0.0 <= got[2] < 0.3 and got[3] == 0.5
    assert got[0] == pytest.approx(0.3 + 0.7 / (1 + 2048 / 8192))
    assert got[2] == pytest.approx(0.3 / (1 + (4096 - 1000) / 1024))


def test_prefix_cache_scorer_formula_and_transform():
    shared: dict = {}
    s = plugin("prefix-cache-scorer", shared=shared)
    a, b, c_ = ep(1), ep(2), ep(3)
    prompt = "p" * 64 * 8  # 8 blocks
    hs = block_hashes(prompt, "llama")
    s.prefix.index.record(a.key, hs)
    s.prefix.index.record(b.key, hs[:2] + hs[3:])  # hole at block 2 -> only 2 consecutive
    assert scores(s, ctx(req(prompt), [a, b, c_])) == [1.0, 0.25, 0.0]
    hd = plugin("prefix-cache-scorer", {"transform": "logistic", "normalization": "input"}, shared=shared)
    got = scores(hd, ctx(req(prompt), [a, b, c_]))
    logistic = [1 / (1 + math.exp(-14 * (x - 0.7))) for x in (1.0, 0.25, 0.0)]
    assert got == pytest.approx(logistic)
    lp = plugin("prefix-cache-scorer", {}, shared=shared, dialect="heimdall")  # longestPrefix by default
    assert scores(lp, ctx(req(prompt + "q" * 64 * 8), [a, b, c_])) == [1.0, 0.25, 0.0]
    assert scores(s, ctx(req(prompt + "q" * 64 * 8), [a, b, c_])) == [0.5, 0.125, 0.0]


def test_no_hit_lru():
    shared: dict = {}
    s = plugin("no-hit-lru-scorer", shared=shared)
    eps = [ep(1), ep(2), ep(3)]
    res = _result(eps[0])
    c = ctx(req("cold prompt"), eps)
    st = state()
    assert scores(s, c, st) == [1.0, 1.0, 1.0]
    s.pre_request(c, res, st)
    st = state()
    c2 = ctx(req("another cold prompt"), eps)
    assert scores(s, c2, st) == [0.5, 1.0, 1.0]  # c=1 in LRU: (1-0)/(1+1)
    s.pre_request(c2, _result(eps[1]), st)
    assert scores(s, ctx(req("third"), eps), state()) == [2 / 3, 1 / 3, 1.0]
    # a warm request scores 0.5 everywhere
    s.prefix.index.record(eps[2].key, block_hashes("warm prompt", "llama"))
    assert scores(s, ctx(req("warm prompt"), eps), state()) == [0.5, 0.5, 0.5]


def _result(e, prefill=None):
    from scheduling.api import SchedulingResult

    return SchedulingResult(targets=[e], prefill=prefill)


def _session_flow(s, eps, headers, now=0.0):
    st = state()
    c = ctx(req(headers=headers), eps, now=now)
    got = scores(s, c, st)
    best = max(range(len(eps)), key=lambda i: got[i])
    res = _result(eps[best])
    s.pre_request(c, res, st)
    return got, res


def test_session_affinity_sticky_ttl_and_hash_only():
    s = plugin("session-affinity-scorer", {"ttlSeconds": 100})
    eps = [ep(1, waiting=3), ep(2, waiting=0), ep(3, waiting=1)]
    got, res = _session_flow(s, eps, {"x-session-id": "alice"})
    assert got == [0.0, 1.0, 0.0]  # new session -> least loaded
    assert "alice" not in repr(s.sessions)  # only a hash is kept
    assert all(isinstance(k, int) for k in s.sessions)
    assert base64.b64decode(res.response_headers["x-session-token"]).decode() == eps[1].key
    eps2 = [ep(1, waiting=0), ep(2, waiting=2), ep(3, waiting=0)]  # pod 2 busier but within margin
    got, _ = _session_flow(s, eps2, {"x-session-id": "alice"}, now=50)
    assert got == [0.0, 1.0, 0.0]
    got, _ = _session_flow(s, eps2, {"x-session-id": "alice"}, now=151)  # idle > TTL: new session
    assert got == [1.0, 0.0, 1.0]


def test_session_affinity_rebalances_when_clearly_busier():
    s = plugin("session-affinity-scorer")
    eps = [ep(1), ep(2, running=1)]
    _session_flow(s, eps, {"x-session-id": "bob"})
    busy = [ep(1, waiting=3, running=5), ep(2, running=1)]
    got, _ = _session_flow(s, busy, {"x-session-id": "bob"}, now=1)
    assert got == [0.0, 1.0]


def test_session_affinity_sources_in_order():
    srcs = [
        {"type": "header", "name": "X-Sess"},
        {"type": "cookie", "name": "sid"},
        {"type": "query", "name": "session"},
        {"type": "jwtClaim", "name": "sub"},
    ]
    s = plugin("session-affinity-scorer", {"sources": srcs})
    payload = base64.urlsafe_b64encode(orjson.dumps({"sub": "user-7"})).decode().rstrip("=")
    assert s.session_key({"x-sess": "h", "cookie": "sid=c"}) == "h"
    assert s.session_key({"cookie": "a=1; sid=c"}) == "c"
    assert s.session_key({":path": "/v1/chat?session=q&x=1"}) == "q"
    assert s.session_key({"authorization": f"Bearer hdr.{payload}.sig"}) == "user-7"
    assert s.session_key({}) == ""


def test_session_affinity_llmd_token():
    s = plugin("session-affinity-scorer")
    eps = [ep(1), ep(2), ep(3)]
    token = base64.b64encode(eps[2].key.encode()).decode()
    assert scores(s, ctx(req(headers={"x-session-token": token}), eps)) == [0.0, 0.0, 1.0]
    assert scores(s, ctx(req(), eps)) == [0.0, 0.0, 0.0]
