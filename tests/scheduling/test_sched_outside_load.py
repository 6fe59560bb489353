"""Traffic that bypasses Pointsman: the engines' scraped queues above its own in-flight count are counted on top of
the requests it sends afterwards (scheduling/latency/outside.py, the estimated-latency scorer's outsideLoad)."""

from __future__ import annotations

import dataclasses

import pytest
from sched_helpers import ctx, ep, plugin, req, scores

from scheduling.api import InflightLoad
from scheduling.latency import OutsideLoad
from scheduling.types import Metrics

PER_TOKEN, OVERHEAD, DECODE = 250e-6, 0.03, 128 * 0.012


def cost(uncached: float, n: int) -> float:
    return (OVERHEAD + uncached * PER_TOKEN + DECODE) * (1 + min(n, 15) / 15)


def test_the_excess_of_a_scrape_over_the_own_count_is_outside_load():
    o = OutsideLoad(max_age=2.0)
    a, b, c = ep(1, running=7), ep(2, running=3), ep(3, running=2)
    own = {a.key: InflightLoad(5, 0), b.key: InflightLoad(4, 0)}
    assert o.view(own) is own  # nothing outside yet: the view is the in-flight view itself
    o.scraped([a, b, c], now=1.0)
    assert (o.get(a.key), o.get(b.key), o.get(c.key)) == (2, 0, 2)
    view = o.view(own)
    assert view.get(a.key) == InflightLoad(7, 0) and view.get(b.key) == InflightLoad(4, 0)
    assert view.get(c.key) == InflightLoad(2, 0) and view.get(ep(4).key) is None
    assert set(view) == {a.key, b.key, c.key} and len(view) == 3 and view[c.key].requests == 2
    with pytest.raises(KeyError):
        view[ep(4).key]
    # Own picks after the scrape land on top of what the engine runs for others.
    own[a.key] = InflightLoad(8, 0)
    assert o.view(own).get(a.key) == InflightLoad(10, 0)


def test_outside_load_follows_the_scrapes_and_ages_out():
    o = OutsideLoad(max_age=2.0)
    a, b = ep(1, running=6), ep(2, running=4)
    o.view({})
    o.scraped([a, b], now=0.0)
    assert (o.get(a.key), o.get(b.key)) == (6, 4)
    o.scraped([ep(1)], now=1.0)  # the bypassing requests on a ended
    assert o.get(a.key) == 0 and o.get(b.key) == 4
    o.scraped([ep(1)], now=2.5)  # b's scrapes stopped: its excess is forgotten
    assert o.get(b.key) == 0 and len(o) == 0
    stale = dataclasses.replace(ep(3), metrics=Metrics(running=5, stale=True))  # a stale scrape says nothing
    o.scraped([stale, ep(2, running=3)], now=3.0)
    assert o.get(stale.key) == 0 and o.get(b.key) == 3
    o.forget(b.key)
    assert len(o) == 0


def test_the_scorer_counts_bypassing_requests_on_top_of_its_own():
    s = plugin("estimated-latency-scorer")
    a, b = ep(1, running=6), ep(2, running=2)  # the engines run 6 and 2; Pointsman sent 2 to each
    own = {a.key: InflightLoad(2, 0), b.key: InflightLoad(2, 0)}
    prompt = req("x" * 400)  # 100 tokens
    scores(s, ctx(prompt, [a, b], inflight=own))  # a decision: the scorer sees the in-flight view
    s.engine_metrics([a, b], 0.0)  # the scrape: 4 requests on a that Pointsman did not send
    own = {a.key: InflightLoad(4, 0), b.key: InflightLoad(4, 0)}  # two more sent to each since the scrape
    got = scores(s, ctx(prompt, [a, b], inflight=own))
    ca, cb = cost(100, 8), cost(100, 4)  # a: its 4 + the 4 outside (the scrape's 6 alone would hide 2)
    assert got == pytest.approx([cb / ca, 1.0])
    off = plugin("estimated-latency-scorer", {"outsideLoad": False})
    scores(off, ctx(prompt, [a, b], inflight={a.key: InflightLoad(2, 0), b.key: InflightLoad(2, 0)}))
    off.engine_metrics([a, b], 0.0)
    got = scores(off, ctx(prompt, [a, b], inflight=own))
    assert got == pytest.approx([cost(100, 4) / cost(100, 6), 1.0])  # max(own 4, scraped 6)
    s.endpoint_removed(a.key)
    got = scores(s, ctx(prompt, [a, b], inflight=own))
    assert got == pytest.approx([cost(100, 4) / cost(100, 6), 1.0])


def test_without_bypassing_traffic_nothing_changes():
    s = plugin("estimated-latency-scorer")
    off = plugin("estimated-latency-scorer", {"outsideLoad": False})
    a, b = ep(1, running=3), ep(2, running=1)
    own = {a.key: InflightLoad(3, 0), b.key: InflightLoad(1, 0)}
    for sc in (s, off):
        scores(sc, ctx(req("y" * 400), [a, b], inflight=own))
        sc.engine_metrics([a, b], 0.0)
    later = {a.key: InflightLoad(5, 0), b.key: InflightLoad(1, 0)}
    assert scores(s, ctx(req("y" * 400), [a, b], inflight=later)) == \
        scores(off, ctx(req("y" * 400), [a, b], inflight=later))
