"""SLO classes (scheduling/latency/classes.py): a request looser than the tightest objective stated lately yields
the endpoints the tight class can still use; a tight one takes the best; without headers nothing changes."""

from __future__ import annotations

from sched_helpers import ctx, ep, plugin, req, state

from scheduling.api import InflightLoad
from scheduling.latency import LOOSE, TIGHT, Slo, SloClasses, decision_slo, place
from scheduling.prefix import block_hashes

PROMPT = "s" * 64 * 125  # 2000 tokens, held by every endpoint below
TIGHT_H = {"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20"}  # the outside suite's names
LOOSE_H = {"x-slo-ttft-ms": "2000"}
LOADS = (0, 6, 12)  # running requests: a idle, b half busy, c too busy for a 20 ms TPOT (12 ms x 1.8)


def _fleet(params: dict | None = None):
    s = plugin("estimated-latency-scorer", {"defaultOutputTokens": 64, **(params or {})})  # the bench's outputs
    eps = [ep(i + 1) for i in range(len(LOADS))]
    for e in eps:
        s.prefix.index.record(e.key, block_hashes(PROMPT, "llama"))
    inflight = {e.key: InflightLoad(n, 0) for e, n in zip(eps, LOADS, strict=True)}
    return s, eps, inflight


def _score(s, eps, inflight, headers: dict[str, str], now: float = 0.0, explain: bool = False):
    st = state()
    got = s.score(ctx(req(PROMPT, headers=headers), eps, inflight=inflight, now=now, explain=explain), eps, st)
    best = max(range(len(eps)), key=lambda i: got[i])
    return eps[best].key, got, st


def test_a_loose_request_leaves_the_short_queue_to_the_tight_class():
    s, (a, b, c), inflight = _fleet()
    eps = [a, b, c]
    first, _, st = _score(s, eps, inflight, LOOSE_H)
    assert first == a.key and decision_slo(st).klass == TIGHT, "no tighter class seen yet: it takes the best"
    tight, _, st = _score(s, eps, inflight, TIGHT_H, now=1.0)
    assert tight == a.key and decision_slo(st).klass == TIGHT
    loose, _, st = _score(s, eps, inflight, LOOSE_H, now=2.0)
    verdict = decision_slo(st)
    assert verdict.klass == LOOSE and loose == b.key, "b meets 2 s and leaves the idle a to the tight class"
    s1, _, _ = _fleet({"sloYield": 1.0})  # yielding harder: c, which the tight class cannot use at all
    _score(s1, eps, inflight, TIGHT_H, now=1.0)
    loose, _, st = _score(s1, eps, inflight, LOOSE_H, now=2.0)
    verdict = decision_slo(st)
    assert verdict.klass == LOOSE and loose == c.key, "c still meets 2 s and the tight class cannot use it"
    assert c.key in verdict.headroom  # it meets its own objective with headroom there
    ttft_room, tpot_room = verdict.headroom_of(c.key)
    assert tpot_room is None and 0.0 < ttft_room < 2.0
    assert verdict.headroom_of("nowhere") == (None, None)


def test_the_tight_class_expires_and_yield_zero_turns_it_off():
    s, eps, inflight = _fleet({"sloClassWindowSeconds": 10.0})
    _score(s, eps, inflight, TIGHT_H, now=0.0)
    assert _score(s, eps, inflight, LOOSE_H, now=5.0)[0] != eps[0].key
    late, _, st = _score(s, eps, inflight, LOOSE_H, now=16.0)  # the last tight request was 16 s ago
    assert late == eps[0].key and decision_slo(st).klass == TIGHT
    s0, eps0, inflight0 = _fleet({"sloYield": 0.0})
    _score(s0, eps0, inflight0, TIGHT_H)
    picked, _, st = _score(s0, eps0, inflight0, LOOSE_H)
    assert picked == eps0[0].key and decision_slo(st).klass == LOOSE


def test_explain_does_not_teach_the_classes():
    s, eps, inflight = _fleet()
    _score(s, eps, inflight, TIGHT_H, explain=True)  # a dry run
    assert s.classes.tightest(0.0) is None
    assert _score(s, eps, inflight, LOOSE_H)[0] == eps[0].key


def test_without_headers_the_scores_are_those_of_a_scorer_without_slos():
    s, eps, inflight = _fleet()
    plain, _, _ = _fleet({"sloAware": False})
    for headers, now in ((TIGHT_H, 0.0), (LOOSE_H, 1.0)):
        _score(s, eps, inflight, headers, now)
    for now in (1.5, 30.0):
        _, got, st = _score(s, eps, inflight, {}, now)
        _, want, _ = _score(plain, eps, inflight, {}, now)
        assert got == want and decision_slo(st) is None


def test_classes_and_penalties():
    classes = SloClasses(60.0)
    assert classes.classify(Slo(2.0, None), 0.0) == (TIGHT, None)
    classes.observe(Slo(0.25, 0.02), 0.0)
    classes.observe(Slo(2.0, None), 1.0)
    assert classes.tightest(1.0) == Slo(0.25, 0.02)
    assert classes.classify(Slo(2.0, None), 1.0) == (LOOSE, Slo(0.25, 0.02))
    assert classes.classify(Slo(0.25, 0.02), 1.0)[0] == TIGHT
    assert classes.classify(Slo(0.1, None), 1.0)[0] == TIGHT  # tighter than any seen
    assert classes.classify(Slo(None, 0.05), 1.0)[0] == TIGHT  # no TTFT objective: nothing to yield with
    for i in range(40):  # bounded: the oldest objectives go first
        classes.observe(Slo(3.0 + i, None), 2.0)
    assert len(classes.seen) == 32 and classes.tightest(2.0) == Slo(3.0 + 8, None)
    # least loaded 1, a tight miss 0, in between by the room left; scaled by the loose request's slack
    floors = [(0.05, 0.012), (0.15, 0.016), (0.3, 0.012), (0.05, 0.021)]
    keys = ["a", "b", "c", "d"]
    placed = place(Slo(2.0, None), Slo(0.25, 0.02), keys, floors, 0.8, 1.0, 0.25)
    pen = placed.penalties
    assert placed.klass == LOOSE and pen[0] == 1.35 and pen[2] == 0.0 and pen[3] == 0.0
    assert abs(pen[1] - 1.35 * 0.5) < 1e-9  # the TPOT room is the scarcer: (20 − 16) / (20 − 12)
    assert placed.scarce == frozenset(), "half the candidates still have room: not scarce"
    assert place(Slo(2.0, None), Slo(0.25, 0.02), keys, floors, 0.8, 1.0, 0.5).scarce == {"a", "b"}
    assert place(Slo(2.0, None), Slo(0.25, 0.02), keys, floors, 0.8, 0.0, 0.5).penalties is None  # no yielding
    none_left = place(Slo(2.0, None), Slo(0.25, None), ["a"], [(0.3, 0.0)], 0.8, 1.0, 1.0)
    assert none_left.penalties == [0.0] and none_left.scarce == frozenset()  # no room anywhere: nothing to keep
