"""SLO-aware picks (estimated-latency-scorer with x-llm-d-slo-ttft-ms / -tpot-ms, scheduling/latency/slo.py): the headers,
the tiers (meets with headroom, meets, misses), the verdict the shell reads, and what it does without headers."""

from __future__ import annotations

from sched_helpers import ctx, ep, plugin, req, state

from scheduling.api import InflightLoad
from scheduling.latency import MAX_SLO_MS, Slo, decision_slo, slo_from_headers
from scheduling.prefix import block_hashes

PROMPT = "s" * 64 * 125  # 125 blocks = 2000 tokens: an uncached prefill of 0.53 s with the reference timings


def test_headers_current_names_first_aliases_and_bad_values():
    assert slo_from_headers({"x-llm-d-slo-ttft-ms": "250"}) == Slo(0.25, None)
    assert slo_from_headers({"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "40"}) == Slo(0.25, 0.04)
    assert slo_from_headers({"x-llm-d-slo-ttft-ms": "100", "x-slo-ttft-ms": "900"}) == Slo(0.1, None)
    assert slo_from_headers({"x-llm-d-slo-tpot-ms": "12.5"}) == Slo(None, 0.0125)
    for bad in ("", "soon", "-5", "0", "nan", "inf", "1e400"):
        assert slo_from_headers({"x-llm-d-slo-ttft-ms": bad}) is None, bad
    huge = slo_from_headers({"x-llm-d-slo-ttft-ms": "9" * 30})
    assert huge == Slo(MAX_SLO_MS / 1000, None)  # capped: it cannot overflow a deadline
    assert slo_from_headers({}) is None


def _setup():
    shared: dict = {}
    s = plugin("estimated-latency-scorer", shared=shared)
    a, b = ep(1), ep(2)
    s.prefix.index.record(a.key, block_hashes(PROMPT, "llama"))  # a holds the whole prompt
    return s, a, b


def _pick(s, a, b, headers: dict[str, str]) -> tuple[str, dict]:
    st = state()
    r = req(PROMPT, headers=headers)
    got = s.score(ctx(r, [a, b], inflight={a.key: InflightLoad(10, 0)}), [a, b], st)
    return (a.key if got[0] >= got[1] else b.key), st


def test_an_slo_request_avoids_the_endpoint_predicted_to_miss():
    """a holds the prompt but runs 10 requests (its decode is slow); b is idle but would prefill 2000 tokens.
    Without an objective b is cheaper overall; with a 250 ms TTFT objective only a's cached prefill meets it."""
    s, a, b = _setup()
    plain, st = _pick(s, a, b, {})
    assert plain == b.key and decision_slo(st) is None
    tight, st = _pick(s, a, b, {"x-llm-d-slo-ttft-ms": "250"})
    assert tight == a.key
    verdict = decision_slo(st)
    assert verdict is not None and verdict.attainable and verdict.met == {a.key}
    ttft_a, _ = verdict.predicted[a.key]
    ttft_b, _ = verdict.predicted[b.key]
    assert ttft_a < 0.25 < ttft_b
    loose, st = _pick(s, a, b, {"x-llm-d-slo-ttft-ms": "2000"})
    assert loose == b.key, "both meet a loose objective: the cheaper one, as without it"
    assert decision_slo(st).headroom == {a.key, b.key}


def test_when_none_can_meet_it_the_request_goes_where_it_misses_least():
    s, a, b = _setup()
    picked, st = _pick(s, a, b, {"x-llm-d-slo-ttft-ms": "5"})  # 5 ms: nobody
    verdict = decision_slo(st)
    assert verdict is not None and not verdict.attainable
    assert picked == a.key  # the least predicted TTFT
    tpot_only, st = _pick(s, a, b, {"x-llm-d-slo-tpot-ms": "13"})  # b decodes at 12 ms, a at 20 ms (10 running)
    assert tpot_only == b.key and decision_slo(st).met == {b.key}


def test_slo_aware_off_ignores_the_headers():
    s = plugin("estimated-latency-scorer", {"sloAware": False})
    a, b = ep(1), ep(2)
    s.prefix.index.record(a.key, block_hashes(PROMPT, "llama"))
    picked, st = _pick(s, a, b, {"x-llm-d-slo-ttft-ms": "250"})
    assert picked == b.key and decision_slo(st) is None
