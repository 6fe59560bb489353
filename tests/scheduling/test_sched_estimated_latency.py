"""estimated-latency-scorer: the predicted-latency formula, its backlog and duration learning, and its trade-off."""

from __future__ import annotations

import pytest
from sched_helpers import ctx, ep, match, plugin, req, scores, state

from scheduling.api import InflightLoad, SchedulingResult
from scheduling.prefix import block_hashes

PER_TOKEN, OVERHEAD, DECODE = 250e-6, 0.03, 128 * 0.012  # default output budget × inter-token time


def ttft(uncached: float, n: int, backlog: float = 0.0, wait: float = 0.0, decode: float = DECODE) -> float:
    """The scorer's cost: predicted TTFT plus the decode time at this endpoint's batch."""
    return (OVERHEAD + (backlog + uncached) * PER_TOKEN + decode) * (1 + min(n, 15) / 15) + wait


def test_formula_prefix_and_load():
    shared: dict = {}
    s = plugin("estimated-latency-scorer", shared=shared)
    prompt = "p" * 64 * 10  # 10 blocks = 160 tokens
    a, b, c = ep(1), ep(2), ep(3, waiting=3, running=5)  # c: fresh metrics say 8 requests
    s.prefix.index.record(a.key, block_hashes(prompt, "llama")[:6])  # a holds 6 blocks = 96 tokens
    got = scores(s, ctx(req(prompt), [a, b, c], inflight={b.key: InflightLoad(2, 0)}))
    costs = [ttft(160 - 96, 0), ttft(160, 2), ttft(160, 8)]
    assert got == pytest.approx([min(costs) / x for x in costs])
    assert got[0] == 1.0


def test_queue_past_max_num_seqs_waits_for_a_slot_using_learned_durations():
    s = plugin("estimated-latency-scorer", {"maxNumSeqs": 4, "initialRequestSeconds": 2.0})
    a, b = ep(1), ep(2)
    full = {a.key: InflightLoad(6, 0)}
    got = scores(s, ctx(req("x" * 400), [a, b], inflight=full))
    cost_a = (OVERHEAD + 100 * PER_TOKEN + DECODE) * 2.0 + (6 - 3) * 2.0 / 4
    cost_b = OVERHEAD + 100 * PER_TOKEN + DECODE
    assert got == pytest.approx([cost_b / cost_a, 1.0])
    # A finished request teaches the scorer how long requests on `a` take.
    c0 = ctx(req("y"), [a, b], now=10.0)
    res = SchedulingResult(targets=[a])
    st = state()
    s.pre_request(c0, res, st)
    c0.now = 10.5
    s.response_complete(c0, res, st)
    got = scores(s, ctx(req("x" * 400), [a, b], inflight=full, now=100.0))
    assert got[0] == pytest.approx(cost_b / ((OVERHEAD + 100 * PER_TOKEN + DECODE) * 2.0 + 3 * 0.5 / 4))


def test_backlog_of_sent_prefill_drains_over_time():
    s = plugin("estimated-latency-scorer")
    a, b = ep(1), ep(2)
    big = req("q" * 4 * 4000)  # 4000 uncached tokens sent to a at t=0
    st = state()
    c0 = ctx(big, [a, b], now=0.0)
    s.score(c0, [a, b], st)
    s.pre_request(c0, SchedulingResult(targets=[a]), st)
    small = req("z" * 4 * 100)
    got = scores(s, ctx(small, [a, b], inflight={}, now=0.5))  # 0.5 s drains 2000 tokens
    assert got == pytest.approx([ttft(100, 0) / ttft(100, 0, backlog=2000), 1.0])
    assert scores(s, ctx(small, [a, b], now=2.0)) == [1.0, 1.0]


def test_leaves_the_cached_endpoint_only_when_its_load_outweighs_the_prefill_saved():
    shared: dict = {}
    s = plugin("estimated-latency-scorer", shared=shared)
    prompt = "s" * 4 * 2048  # a 2048-token shared system prompt
    a, b = ep(1), ep(2)
    s.prefix.index.record(a.key, block_hashes(prompt, "llama"))
    light = scores(s, ctx(req(prompt), [a, b], inflight={a.key: InflightLoad(4, 0)}))
    assert light[0] == 1.0 and light[1] < 1.0  # 4 in flight: the cache still wins
    heavy = scores(s, ctx(req(prompt), [a, b], inflight={a.key: InflightLoad(40, 0)}))
    assert heavy[1] == 1.0 and heavy[0] < 1.0  # past max-num-seqs: go elsewhere


def test_records_blocks_for_the_chosen_endpoint():
    shared: dict = {}
    s = plugin("estimated-latency-scorer", shared=shared)
    a, b = ep(1), ep(2)
    prompt = "r" * 64 * 4
    c0 = ctx(req(prompt), [a, b])
    st = state()
    s.score(c0, [a, b], st)
    res = SchedulingResult(targets=[b])
    s.pre_request(c0, res, st)
    assert match(s.prefix.index, block_hashes(prompt, "llama")) == {}  # the scorer never writes the index
    s.prefix.pre_request(c0, res, st)  # its producer does, after the pick
    assert match(s.prefix.index, block_hashes(prompt, "llama")) == {b.key: 4}


def test_a_growing_context_is_credited_past_four_thousand_tokens():
    """An agent's context grows turn by turn; with maxPrefixBlocksToMatch 1,024 (deploy/profiles/agent-sessions.yaml)
    the scorer's producer matches and records up to 16k tokens, so a 12,000-token context is credited where it is
    held (the default's 256 blocks stop at 4,096 tokens)."""
    s = plugin("estimated-latency-scorer", {"maxPrefixBlocksToMatch": 1024})
    a, b = ep(1), ep(2)
    turn = "c" * 4 * 12_000  # a 12,000-token context (4 characters a token)
    c0 = ctx(req(turn), [a, b])
    st = state()
    s.score(c0, [a, b], st)
    res = SchedulingResult(targets=[a])
    s.pre_request(c0, res, st)
    s.prefix.pre_request(c0, res, st)
    assert match(s.prefix.index, block_hashes(turn, "llama", max_blocks=4096)) == {a.key: 750}
    nxt = turn + "d" * 4 * 600  # the next turn: the context plus an answer and a tool result
    got = scores(s, ctx(req(nxt), [a, b], inflight={a.key: InflightLoad(8, 0)}, now=10.0))  # backlog drained
    assert got == pytest.approx([1.0, ttft(600, 8) / ttft(12_600, 0)])


def test_output_budget_from_the_body_and_decode_weight():
    from scheduling.plugins.scorers.estimated_latency import output_tokens

    assert output_tokens({"max_tokens": 7}, 128) == 7
    assert output_tokens({"max_completion_tokens": 9, "max_tokens": 7}, 128) == 9
    assert output_tokens({"max_tokens": 0}, 128) == 128 and output_tokens(None, 5) == 5
    s = plugin("estimated-latency-scorer", {"decodeWeight": 0.0})
    a, b = ep(1), ep(2)
    r = req("x" * 400)
    r.body = {"max_tokens": 1000}
    got = scores(s, ctx(r, [a, b], inflight={a.key: InflightLoad(5, 0)}))
    assert got == pytest.approx([ttft(100, 0, decode=0) / ttft(100, 5, decode=0), 1.0])
    s2 = plugin("estimated-latency-scorer")
    got2 = scores(s2, ctx(r, [a, b], inflight={a.key: InflightLoad(5, 0)}))
    assert got2 == pytest.approx([ttft(100, 0, decode=12.0) / ttft(100, 5, decode=12.0), 1.0])


def test_a_media_request_is_priced_without_its_decode_term():
    """A request holding media (LLMRequest.media) counts a quarter of its output in the decode term (mediaDecodeWeight
    0.25): an image cached on a busier endpoint keeps it there, where the same text-only request leaves for the idle
    one because of the batch its tokens would decode in. A text-only request is priced as before."""
    prompt = "s" * 4 * 672  # a system prompt and an image's placeholders: 672 tokens
    a, b = ep(1), ep(2)
    busy = {a.key: InflightLoad(4, 0)}
    out = {"max_tokens": 64}
    for weight, media_wins in ((None, True), (1.0, False)):  # 1: priced as text
        s = plugin("estimated-latency-scorer", {} if weight is None else {"mediaDecodeWeight": weight})
        s.prefix.index.record(a.key, block_hashes(prompt, "llama"))
        text, media = req(prompt + "q" * 256), req(prompt + "q" * 256)
        text.body = media.body = out
        media.media = True
        got_text = scores(s, ctx(text, [a, b], inflight=busy))
        decode = 64 * 0.012
        costs = [ttft(64, 4, decode=decode), ttft(736, 0, decode=decode)]
        assert got_text == pytest.approx([min(costs) / c for c in costs])
        assert got_text[1] == 1.0  # text only: the idle endpoint
        w = 0.25 if weight is None else weight
        costs = [ttft(64, 4, decode=round(64 * w) * 0.012), ttft(736, 0, decode=round(64 * w) * 0.012)]
        got = scores(s, ctx(media, [a, b], inflight=busy))
        assert got == pytest.approx([min(costs) / c for c in costs])
        assert (got[0] == 1.0) is media_wins


def test_eviction_on_a_full_endpoint_is_priced():
    shared: dict = {}
    s = plugin("estimated-latency-scorer", {"lruCapacityPerServer": 8, "decodeWeight": 0.0}, shared=shared)
    a, b = ep(1), ep(2)
    s.prefix.index.record(a.key, block_hashes("o" * 64 * 8, "llama"))  # a is full of another prefix
    prompt = "n" * 64 * 4  # 4 new blocks = 64 tokens, cached nowhere
    got = scores(s, ctx(req(prompt), [a, b]))
    cost_a = ttft(64, 0, decode=0) + 1.0 * 4 * 16 * PER_TOKEN
    assert got == pytest.approx([ttft(64, 0, decode=0) / cost_a, 1.0])


def test_calibration_learns_how_much_faster_the_engines_are():
    """Engines twice as fast as the reference profile: k(e) converges to 0.5, and costs shrink with it."""
    s = plugin("estimated-latency-scorer", {"calibrationAlpha": 0.2})
    a, b = ep(1), ep(2)
    prompt = "c" * 64 * 20  # 320 tokens
    body = {"model": "llama", "max_tokens": 50}
    now = 0.0
    for i in range(60):
        r = req(prompt + str(i))
        r.body = body
        c = ctx(r, [a, b], now=now)
        st = state()
        s.score(c, [a, b], st)
        res = SchedulingResult(targets=[a])
        s.pre_request(c, res, st)
        model = (OVERHEAD + 320 * PER_TOKEN + 50 * 0.012)  # an idle endpoint: no slowdown, no wait
        c.now = now + 0.5 * model  # it finished in half the reference time
        s.response_complete(c, res, st)
        now += 10.0  # far apart: the prefill backlog has drained before the next request
    assert s.model.learner.scale(a.key) == pytest.approx(0.5, rel=0.05)
    assert s.model.learner.pool_scale == pytest.approx(0.5, rel=0.05)
    assert s.model.learner.scale(b.key) == s.model.learner.pool_scale  # no samples of its own: the pool's factor
    s.endpoint_removed(a.key)
    assert a.key not in s.tracked_endpoints()


def test_calibration_off_keeps_the_reference_timings():
    s = plugin("estimated-latency-scorer", {"calibrate": False})
    a = ep(1)
    c = ctx(req("d" * 640), [a])
    st = state()
    s.score(c, [a], st)
    res = SchedulingResult(targets=[a])
    s.pre_request(c, res, st)
    c.now = 0.001
    s.response_complete(c, res, st)
    assert s.model.learner.scale(a.key) == 1.0 and s.model.learner.pool_scale == 1.0


def test_calibration_sample_is_taken_against_what_the_decision_saw():
    """The shell counts the pick in flight before pre_request runs, and other requests finish before this one
    does: the sample still divides by the model the decision priced (its n, its backlog, its D(e))."""
    s = plugin("estimated-latency-scorer", {"calibrationAlpha": 1.0, "durationEwmaAlpha": 1.0})
    a = ep(1, waiting=10, running=10)  # n = 20 > maxNumSeqs - 1: a wait for a slot, with D(e) = 2 s learnt below
    warm = SchedulingResult(targets=[a])
    s.response_complete(ctx(req("w"), [a], now=2.0), warm, {"estimated-latency.start": 0.0})
    s.model.learner.scales.clear()  # the warm-up taught D(e) only
    s.model.learner.pool_scale = 1.0
    prompt = "c" * 64 * 20  # 320 tokens, nothing cached
    c = ctx(req(prompt), [a], now=100.0, inflight={a.key: InflightLoad(3, 0)})
    st = state()
    s.score(c, [a], st)
    res = SchedulingResult(targets=[a])
    c.inflight = {a.key: InflightLoad(4, 0)}  # the shell's ticket for this very request
    s.pre_request(c, res, st)
    s.response_complete(ctx(req("other"), [a], now=100.5), warm, {"estimated-latency.start": 99.0})  # D(e) moves
    model = (OVERHEAD + 320 * PER_TOKEN + DECODE) * 2.0  # slowdown at a full batch
    wait = (20 - 15) * 2.0 / 16
    c.now = 100.0 + wait + 0.25 * model
    s.response_complete(c, res, st)
    assert s.model.learner.scale(a.key) == pytest.approx(0.25)


def test_the_engine_load_is_derived_once_per_metrics_snapshot():
    from dataclasses import replace

    from scheduling.types import Metrics

    m = Metrics(waiting=3, running=5, stale=False)
    assert m.fresh_load == 8
    assert replace(m, stale=True).fresh_load == 0  # a stale scrape says nothing about the load
    assert replace(m, waiting=1).fresh_load == 6 and Metrics().fresh_load == 0
    assert replace(m, stale=True) == Metrics(waiting=3, running=5, stale=True)  # not part of equality


def test_load_beyond_the_batch_and_odd_counts_price_as_the_formula_says():
    s = plugin("estimated-latency-scorer")
    a, b, c = ep(1), ep(2), ep(3)
    inflight = {a.key: InflightLoad(40, 0), b.key: InflightLoad(15, 0), c.key: InflightLoad(7, 0)}
    got = scores(s, ctx(req("q" * 640), [a, b, c], inflight=inflight))
    costs = [ttft(160, 40, wait=(40 - 15) * 1.0 / 16), ttft(160, 15), ttft(160, 7)]
    assert got == pytest.approx([min(costs) / x for x in costs])
