from __future__ import annotations

import random

import pytest
from sched_helpers import ctx, ep, plugin, req

from scheduling.api import SchedulingResult
from scheduling.framework import Filter, Profile, ProfileScheduler, Scorer, create
from scheduling.framework.profile import clamp_scores
from scheduling.types import ErrorCode, SchedulingError


class Fixed(Scorer):
    type_name = "fixed-test-scorer"

    def __init__(self, values, name="fixed"):
        super().__init__(name)
        self.values = values

    def score(self, c, candidates, state):
        return [self.values[e.key] for e in candidates]


class DropAll(Filter):
    type_name = "drop-all"

    def filter(self, c, candidates, state):
        return []


class Recorder(Scorer):
    type_name = "recorder"

    def __init__(self):
        super().__init__("recorder")
        self.calls = []

    def score(self, c, candidates, state):
        return [0.0] * len(candidates)

    def pre_request(self, c, result, state):
        self.calls.append(("pre", result.primary.key))

    def response_complete(self, c, result, state):
        self.calls.append(("done", result.primary.key))


def sched(filters, scorers, picker=None, rng=None, timer=None):
    prof = Profile("default", filters, scorers, picker or plugin("max-score-picker"))
    return ProfileScheduler(
        "cfg", plugin("single-profile-handler"), {"default": prof}, rng=rng or random.Random(0), timer=timer
    )


def test_weighted_sum_decides():
    a, b = ep(1), ep(2)
    s1 = Fixed({a.key: 1.0, b.key: 0.0}, "s1")
    s2 = Fixed({a.key: 0.0, b.key: 1.0}, "s2")
    assert sched([], [(s1, 1.0), (s2, 2.0)]).schedule(ctx(req(), [a, b])).primary == b
    assert sched([], [(s1, 3.0), (s2, 2.0)]).schedule(ctx(req(), [a, b])).primary == a


def test_scores_are_clamped_before_weighting():
    a, b = ep(1), ep(2)
    wild = Fixed({a.key: 50.0, b.key: 0.9}, "wild")  # 50 clamps to 1.0
    other = Fixed({a.key: 0.0, b.key: 0.2}, "other")
    assert sched([], [(wild, 1.0), (other, 1.0)]).schedule(ctx(req(), [a, b])).primary == b
    assert clamp_scores([-1.0, 0.5, 2.0, float("nan")]) == [0.0, 0.5, 1.0, 0.0]


def test_empty_filter_result_is_resource_exhausted():
    with pytest.raises(SchedulingError) as err:
        sched([DropAll("drop")], []).schedule(ctx(req(), [ep(1)]))
    assert err.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert err.value.code.http_status == 429
    assert "drop" in err.value.message


def test_no_candidates_is_resource_exhausted():
    with pytest.raises(SchedulingError) as err:
        sched([], []).schedule(ctx(req(), []))
    assert err.value.code is ErrorCode.RESOURCE_EXHAUSTED


def test_ties_broken_by_injected_rng():
    eps = [ep(i) for i in range(8)]
    picks = {
        sched([], [], rng=random.Random(seed)).schedule(ctx(req(), eps)).primary.key for seed in range(40)
    }
    assert len(picks) > 3  # random among the tied
    same = [sched([], [], rng=random.Random(5)).schedule(ctx(req(), eps)).primary.key for _ in range(5)]
    assert len(set(same)) == 1  # deterministic under a seed


def test_explain_details_and_timer():
    a, b = ep(1), ep(2)
    s1 = Fixed({a.key: 0.25, b.key: 0.5}, "s1")
    ticks = iter(range(1000))
    s = sched([create("decode-filter")], [(s1, 2.0)], timer=lambda: float(next(ticks)))
    res = s.schedule(ctx(req(), [a, b], explain=True))
    pr = res.profile_results["default"]
    kinds = [d.kind for d in pr.details]
    assert kinds == ["filter", "scorer", "picker"]
    assert pr.details[0].kept == [a.key, b.key]
    assert pr.details[1].scores == {a.key: 0.25, b.key: 0.5} and pr.details[1].weight == 2.0
    assert all(d.duration_s == 1.0 for d in pr.details)
    assert pr.totals == {a.key: 0.5, b.key: 1.0}


def test_no_details_without_explain_or_timer():
    res = sched([], []).schedule(ctx(req(), [ep(1)]))
    assert res.profile_results["default"].details == []
    assert res.profile_results["default"].totals == {}


def test_timer_without_explain_records_durations_only():
    s1 = Fixed({ep(1).key: 1.0}, "s1")
    res = sched([], [(s1, 1.0)], timer=lambda: 0.0).schedule(ctx(req(), [ep(1)]))
    d = res.profile_results["default"].details
    assert [x.name for x in d] == ["s1", "max-score-picker"] and d[0].scores is None


def test_lifecycle_hooks_called_once_each():
    rec = Recorder()
    s = sched([], [(rec, 1.0)])
    c = ctx(req(), [ep(1)])
    res = s.schedule(c)
    assert isinstance(res, SchedulingResult) and res.profile == "cfg"
    s.pre_request(c, res)
    s.response_complete(c, res)
    assert rec.calls == [("pre", ep(1).key), ("done", ep(1).key)]


def test_max_num_of_endpoints_gives_ordered_fallbacks():
    eps = [ep(i) for i in range(5)]
    s1 = Fixed({e.key: i / 10 for i, e in enumerate(eps)}, "s1")
    res = sched([], [(s1, 1.0)], picker=plugin("max-score-picker", {"maxNumOfEndpoints": 3})).schedule(
        ctx(req(), eps)
    )
    assert [e.key for e in res.targets] == [eps[4].key, eps[3].key, eps[2].key]


def test_combiner_is_the_weighted_sum():
    from scheduling.framework.profile import make_combiner

    a, b, c = [0.1, 0.5, 1.0], [1.0, 0.0, 0.25], [0.3, 0.3, 0.9]
    assert make_combiner([])() == []
    assert make_combiner([1.0])(a) == a
    assert make_combiner([2.0])(a) == [0.2, 1.0, 2.0]
    got = make_combiner([2.0, 1.0, 3.0])(a, b, c)
    assert got == pytest.approx([2 * x + y + 3 * z for x, y, z in zip(a, b, c, strict=True)])


class Zeros(Scorer):
    type_name = "zeros-test-scorer"

    def score(self, c, candidates, state):
        from scheduling.framework.plugin import ZeroScores

        return ZeroScores([0.0] * len(candidates))


def test_zero_scores_leave_the_sum_but_not_the_trace():
    a, b, d = ep(1), ep(2), ep(3)
    s1 = Fixed({a.key: 0.25, b.key: 0.5, d.key: 1.0}, "s1")
    s2 = Fixed({a.key: 1.0, b.key: 0.0, d.key: 0.5}, "s2")
    plain = sched([], [(s1, 2.0), (Recorder(), 3.0), (s2, 1.0)])
    skipping = sched([], [(s1, 2.0), (Zeros("z"), 3.0), (s2, 1.0)])
    want = plain.schedule(ctx(req(), [a, b, d], explain=True)).profile_results["default"]
    for _ in range(2):  # the second pass reuses the combiner built for the scorers that remain
        got = skipping.schedule(ctx(req(), [a, b, d], explain=True)).profile_results["default"]
        assert got.totals == want.totals == {a.key: 1.5, b.key: 1.0, d.key: 2.5}
        assert [x.name for x in got.details if x.kind == "scorer"] == ["s1", "z", "s2"]
        assert got.details[1].scores == {a.key: 0.0, b.key: 0.0, d.key: 0.0}
    only = sched([], [(Zeros("z"), 1.0)]).schedule(ctx(req(), [a, b], explain=True))
    assert only.profile_results["default"].totals == {a.key: 0.0, b.key: 0.0}
