"""Pickers: max-score, random, weighted-random (A-Res)."""

from __future__ import annotations

import random
from collections import Counter

from sched_helpers import ctx, ep, plugin, req


def pick(name, totals, seed=0, k=1):
    eps = [ep(i) for i in range(len(totals))]
    p = plugin(name, {"maxNumOfEndpoints": k})
    return p.pick(ctx(req(), eps), eps, list(totals), random.Random(seed))


def test_max_score_highest_and_ordered_fallbacks():
    assert pick("max-score-picker", [0.1, 0.9, 0.5]) == [1]
    assert pick("max-score-picker", [0.1, 0.9, 0.5], k=3) == [1, 2, 0]
    assert pick("max-score-picker", [0.1, 0.9, 0.5], k=10) == [1, 2, 0]


def test_max_score_ties_uniform():
    c = Counter(pick("max-score-picker", [1.0, 1.0, 0.0, 1.0], seed=s)[0] for s in range(3000))
    assert set(c) == {0, 1, 3}
    assert all(800 < v < 1200 for v in c.values())
    c2 = Counter(tuple(pick("max-score-picker", [1.0, 1.0, 0.0], seed=s, k=3)) for s in range(400))
    assert set(c2) == {(0, 1, 2), (1, 0, 2)}


def test_max_score_near_ties_go_to_the_least_loaded():
    from scheduling.api import InflightLoad

    eps = [ep(0), ep(1, waiting=1, running=2), ep(2)]
    p = plugin("max-score-picker", {"tieTolerance": 0.02})
    busy = {eps[0].key: InflightLoad(6, 0)}

    def choose(totals, inflight, seed=0):
        return p.pick(ctx(req(), eps, inflight=inflight), eps, list(totals), random.Random(seed))[0]

    # 0 scores a hair better but runs 6; 1 runs 3 by its metrics; 2 is idle and within 2%: it is not starved
    assert choose([1.0, 0.99, 0.985], busy) == 2
    assert choose([1.0, 0.99, 0.9], busy) == 1, "2 is no near-tie: the least loaded of the near-tied"
    assert choose([1.0, 0.97, 0.97], busy) == 0, "beyond the tolerance the best score wins"
    # the engine's own load counts too (1 runs 3, 0 nothing): 0; equally loaded near-ties: at random among them
    assert {choose([1.0, 0.995, 0.5], {}, seed=s) for s in range(400)} == {0}
    assert set(Counter(choose([1.0, 0.995, 0.999], {}, seed=s) for s in range(400))) == {0, 2}
    # GIE's behaviour by default: exact ties only
    assert pick("max-score-picker", [1.0, 0.995, 0.5]) == [0]


def test_random_picker_uniform_and_distinct():
    c = Counter(pick("random-picker", [0.0, 5.0, 0.0], seed=s)[0] for s in range(3000))
    assert all(800 < v < 1200 for v in c.values())
    got = pick("random-picker", [0] * 6, seed=3, k=4)
    assert len(got) == len(set(got)) == 4


def test_weighted_random_proportional():
    c = Counter(pick("weighted-random-picker", [1.0, 3.0], seed=s)[0] for s in range(4000))
    assert 0.70 < c[1] / 4000 < 0.80  # expected 0.75


def test_weighted_random_zero_scores_last_and_all_zero_random():
    for s in range(50):
        order = pick("weighted-random-picker", [0.0, 0.4, 0.0, 0.2], seed=s, k=4)
        assert set(order[:2]) == {1, 3} and set(order[2:]) == {0, 2}
    c = Counter(pick("weighted-random-picker", [0.0, 0.0, 0.0], seed=s)[0] for s in range(3000))
    assert all(800 < v < 1200 for v in c.values())
