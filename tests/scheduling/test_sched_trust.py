"""Prefix trust per endpoint (estimated-latency-scorer, scheduling/latency/trust.py): exact / degraded /
approximate from the KV-event stream's state and disruptions and from the engine's reported hits against the hits
Pointsman predicted; how much a predicted hit is believed when scoring; recovery."""

from __future__ import annotations

import pytest
from sched_helpers import ctx, ep
from test_sched_precise import TOKENS, config, load, store, tokreq

from scheduling.api import SchedulingResult
from scheduling.latency import APPROXIMATE, DEGRADED, EXACT
from scheduling.plugins.scorers.estimated_latency import EstimatedLatencyScorer
from scheduling.prefix.precise import LIVE, PreciseIndex
from scheduling.types import Endpoint, EngineTotals, Metrics

SCORER = "estimated-latency-scorer"


def scorer_of(sched) -> EstimatedLatencyScorer:
    return next(p for p in sched.plugins() if isinstance(p, EstimatedLatencyScorer))


def precise_setup():
    index = PreciseIndex(block_size=16)
    sched = load(config(SCORER, {"prefixSource": "precise"}), index)
    a, b = ep(1), ep(2)
    for e in (a, b):
        index.set_state(e.key, 0, LIVE)
    store(index, a.key, 10)  # a holds the whole prompt (ten blocks)
    return index, sched, scorer_of(sched), a, b


def scrape(e: Endpoint, prompt: float, cached: float, at: float) -> Endpoint:
    return e.with_metrics(Metrics(stale=False, updated_at=at, engine=EngineTotals(
        ttft=(0.0, 0.0), prompt_tokens=prompt, cached_tokens=cached)))


def test_a_disruption_degrades_the_endpoint_and_its_belief_recovers_over_the_window():
    index, sched, s, a, b = precise_setup()
    assert s.trust_view(a.key, 100.0).state == EXACT
    index.note_disruption(a.key, 100.0, "publisher restarted")
    v = s.trust_view(a.key, 100.0, refresh=True)
    assert (v.state, v.belief) == (DEGRADED, 0.5) and "publisher restarted" in v.reason
    assert s.trust_view(a.key, 115.0).belief == 0.75
    assert s.trust_view(a.key, 131.0, refresh=True).state == EXACT
    assert a.key not in s.model.trust.belief
    index.note_disruption(a.key, 200.0, "gap of 2 batches replayed", True)  # a filled gap: a fifth of the window
    assert s.trust_view(a.key, 203.0).state == DEGRADED
    assert s.trust_view(a.key, 207.0).state == EXACT
    index.set_state(b.key, 0, "unknown")  # a failed replay: the approximate index scores it
    assert s.trust_view(b.key, 207.0).state == APPROXIMATE


def test_a_degraded_endpoint_s_hit_counts_for_less_in_the_score():
    index, sched, s, a, b = precise_setup()

    def totals() -> dict[str, float]:
        c = ctx(tokreq(), [a, b], now=100.0)
        c.explain = True
        return sched.schedule(c, dry_run=True).profile_results["default"].totals

    exact = totals()
    assert exact[a.key] == 1.0 > exact[b.key]  # the endpoint holding the prompt wins
    index.note_disruption(a.key, 100.0, "batches lost")
    s.trust_view(a.key, 100.0, refresh=True)  # what engine_metrics does at every scrape
    degraded = totals()
    assert degraded[b.key] > exact[b.key], "believing a's hit half as much narrows its lead"


def _send(sched, s, e: Endpoint, others: list[Endpoint], now: float, n: int) -> None:
    """n requests of the prompt go to `e` (what the shell's pre_request does after a pick)."""
    for i in range(n):
        c = ctx(tokreq(), [e, *others], now=now + i * 0.01)
        s.pre_request(c, SchedulingResult(targets=[e]), {})


def test_disagreement_with_traffic_bypassing_pointsman_lowers_the_belief_and_recovers():
    index, sched, s, a, b = precise_setup()
    tokens = len(TOKENS)
    # Pointsman sends 20 requests to a, predicting ~all their tokens cached (a holds the prompt)
    now = 10.0
    s.engine_metrics([scrape(a, 0, 0, now)], now)
    _send(sched, s, a, [b], now, 20)
    sent = 20 * tokens
    # the engine saw twice those prompt tokens (half came from elsewhere) and hit only a quarter of ours
    s.engine_metrics([scrape(a, 2 * sent, 0.25 * sent, now + 1)], now + 1)
    v = s.trust_view(a.key, now + 1)
    assert v.state == DEGRADED and v.outside_share == pytest.approx(0.5, abs=0.02)
    assert 0.2 <= v.belief <= 0.3 and "bypass" in v.reason
    assert s.model.trust.belief[a.key] == v.belief
    # later the engine delivers what is predicted: the old shortfall decays away
    t = now + 1
    total_prompt, total_hit = 2 * sent, 0.25 * sent
    for _ in range(30):
        t += 10.0
        _send(sched, s, a, [b], t, 20)
        total_prompt += 2 * sent
        total_hit += sent
        s.engine_metrics([scrape(a, total_prompt, total_hit, t + 1)], t + 1)
    v = s.trust_view(a.key, t + 1, refresh=True)
    assert v.state == EXACT and v.belief == 1.0 and a.key not in s.model.trust.belief


def test_without_bypassing_traffic_a_shortfall_is_reported_but_not_discounted():
    index, sched, s, a, b = precise_setup()
    s.engine_metrics([scrape(a, 0, 0, 1.0)], 1.0)
    _send(sched, s, a, [b], 1.0, 20)
    sent = 20 * len(TOKENS)
    s.engine_metrics([scrape(a, sent, 0.5 * sent, 2.0)], 2.0)
    v = s.trust_view(a.key, 2.0, refresh=True)
    assert v.state == DEGRADED and v.belief == 1.0 and v.agreement is not None and v.agreement < 0.6
    assert "bypass" not in v.reason


def test_the_approximate_index_is_approximate_and_believed_by_agreement():
    sched = load(config(SCORER))  # prefixSource approximate: no KV events
    s = scorer_of(sched)
    a = ep(1)
    assert s.trust_view(a.key, 0.0).state == APPROXIMATE
    assert s.trust_view(a.key, 0.0).belief == 1.0  # nothing measured: believed as today
