"""The latency model as a core object (scheduling/latency), without a scorer around it: its cost per candidate,
a pick's backlog, what finished requests teach, and the records peers exchange."""

from __future__ import annotations

import pytest
from sched_helpers import ep

from scheduling.api import InflightLoad
from scheduling.latency import Chosen, LatencyModel, ModelConfig, Timings

REF = Timings(0.03, 250e-6, 0.012)


def costs(model: LatencyModel, tokens: float, candidates, inflight=None, now: float = 0.0, out: int = 128):
    return model.costs(tokens, {}, candidates, inflight or {}, now, out, {}, 10**9, {}, 0.0)


def test_the_cost_is_the_formula_and_a_pick_queues_its_prefill():
    m = LatencyModel(ModelConfig(REF))
    a, b = ep(1), ep(2)
    got, ns = costs(m, 400, [a, b], {b.key: InflightLoad(3, 0)})
    alone = 0.03 + 400 * 250e-6 + 128 * 0.012
    assert ns == [0, 3]
    assert got == pytest.approx([alone, alone * (1 + 3 / 15)])
    m.picked(a.key, 4000, 0.0, 0.0)  # 4000 uncached tokens queued on a at t = 0
    later, _ = costs(m, 400, [a, b], now=0.5)  # 0.5 s drains 2000 of them
    assert later[0] == pytest.approx(alone + 2000 * 250e-6) and later[1] == pytest.approx(alone)
    assert m.tracked() == {a.key}
    m.forget(a.key)
    assert m.tracked() == set() and costs(m, 400, [a], now=0.5)[0] == pytest.approx([alone])


def test_finished_requests_calibrate_and_travel_to_a_peer():
    cfg = ModelConfig(REF, calibration_alpha=1.0, duration_alpha=1.0)
    m, peer = LatencyModel(cfg), LatencyModel(cfg)
    m.learner.set_replicating(True)
    a = ep(1)
    chosen = m.picked(a.key, 400, 0.0, 0.0)
    model = 0.03 + 400 * 250e-6 + 128 * 0.012
    m.finished(a.key, 0.5 * model, chosen, 0, 128)  # twice as fast as the reference
    assert m.learner.scale(a.key) == pytest.approx(0.5) and m.learner.durations[a.key] == pytest.approx(0.5 * model)
    assert m.learner.timings_of(a.key)[:3] == pytest.approx((0.015, 125e-6, 0.006))
    records = m.learner.export()
    assert records == [[a.key, pytest.approx(0.5 * model), pytest.approx(0.5)]] and m.learner.export() == []
    assert peer.learner.apply(records) == 0
    assert peer.learner.scale(a.key) == pytest.approx(0.5)
    assert peer.learner.apply([[a.key, -1.0, 1.0], [a.key, 1.0, 99.0], [a.key, 1.0]]) == 3


def test_a_request_on_an_engine_fitted_at_zero_cost_teaches_no_backlog_weight():
    """An engine whose histograms say it costs nothing (a zero-latency simulator; a fully cached prompt on it) is
    fitted at zero overhead and inter-token time: a request finished there with no backlog queued ahead of it has
    nothing to divide its time by, so it teaches D(e) and no backlog weight (it raised ZeroDivisionError in the
    response hook before)."""
    m = LatencyModel(ModelConfig(REF, duration_alpha=1.0))
    a = ep(1)
    chosen = Chosen(prefill=0.0, duration=0.0, inter_token=0.0, queued=0.0)
    assert m.learner.sample(chosen, 0, 0.002, 1) is None
    m.finished(a.key, 0.002, chosen, 0, 1)
    assert m.learner.durations[a.key] == pytest.approx(0.002)
    backlog = Chosen(prefill=0.0, duration=0.0, inter_token=0.0, queued=0.01)  # some backlog: a sample again
    assert m.learner.sample(backlog, 0, 0.006, 1) == pytest.approx(0.6)
