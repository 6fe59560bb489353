"""The scoring pass over a pool (scheduling/latency/pool.py: flat passes over per-pool arrays, the whole formula only
for the exceptions; small_pool.py for a small pool: one loop) against the formula evaluated endpoint by endpoint, kept
here as the reference.

The states are seeded and varied: pools of 1 to 512 endpoints (on both sides of SMALL_POOL, up to which the pass
prices endpoint by endpoint; a key listed twice, stale metrics, loads past the batch), endpoints on the reference
timings, on their own fitted timings (two scrapes of the engine's histograms) and on the fitted endpoints' mean,
calibrated and not, backlogs, predicted hits with and without the prefix trust's belief, requests in flight,
endpoints short of room (eviction, a waiting session's context). The model's state moves between requests (picks,
finished requests, scrapes, an endpoint's new metrics, an endpoint forgotten) so that what the pass keeps per pool
must follow. Costs and n(e) must be equal, not close; and the built-in default profile must make the same decisions
with the reference in place of the pass.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from scheduling.api import NO_LOAD, InflightLoad, SchedulingContext
from scheduling.config import load_scheduler
from scheduling.latency import LatencyModel, ModelConfig, Timings
from scheduling.latency.small_pool import SMALL_POOL
from scheduling.prefix.index import LOW_ROOM, PrefixIndex
from scheduling.types import Endpoint, EngineTotals, LLMRequest, Metrics

REF = Timings(0.03, 250e-6, 0.012)


def reference_costs(model: LatencyModel, tokens: float, cached: Mapping[str, float], candidates: list[Endpoint],
                    inflight: Mapping[str, InflightLoad], now: float, out_tokens: int,
                    room: Mapping[str, int | float], default_room: int | float, warm: Mapping[str, float],
                    warm_weight: float, low: object = None) -> tuple[list[float], list[int]]:
    """The estimated-latency formula (scheduling/plugins/scorers/estimated_latency.py), one endpoint at a time
    (`low`, a shortcut of the pass, is not needed here)."""
    c = model.config
    ref = c.reference
    s1 = c.max_num_seqs - 1
    costs, ns = [], []
    for e in candidates:
        key = e.key
        n = max(inflight.get(key, NO_LOAD).requests if inflight else 0, e.metrics.fresh_load)
        cc = cached.get(key)
        if cc is not None and key in model.trust.belief:
            cc *= model.trust.belief[key]
        uncached = tokens if cc is None else max(0.0, tokens - cc)
        q = model.backlog.queues().get(key)
        t = model.timings.eff.get(key)
        if t is None and model.timings.pool is not None and key not in model.learner.scales:
            t = model.timings.pool
        if t is None:  # the reference timings × k(e)
            k, unit = model.learner.scale(key), ref.prefill_per_token
            backlog = max(0.0, q.total - (now - q.since) * (1.0 / (k * unit))) if q is not None else 0.0
            decode = c.decode_weight * (ref.inter_token * out_tokens)
            cost = k * (ref.overhead + (backlog + uncached) * unit + decode)
        else:  # fitted timings
            k = 1.0
            o, unit, itl, beta = t
            backlog = max(0.0, q.total - (now - q.since) / unit) if q is not None else 0.0
            cost = o + (beta * backlog + uncached) * unit + c.decode_weight * out_tokens * itl
        cost *= c.slowdown(n)
        if c.eviction_weight and uncached:
            over = -(-uncached // c.block_tokens) - room.get(key, default_room)
            if over > 0:
                cost += k * c.eviction_weight * over * c.block_tokens * unit
                warmed = warm.get(key)
                if warmed:
                    cost += k * warm_weight * min(over * c.block_tokens, warmed) * unit
        if n > s1:
            cost += (n - s1) * model.learner.duration(key) / c.max_num_seqs
        costs.append(cost)
        ns.append(n)
    return costs, ns


def endpoint(i: int, rnd: random.Random, s: int, engine: EngineTotals | None = None, at: float = 0.0) -> Endpoint:
    addr = f"10.7.{i // 250}.{i % 250}"
    m = Metrics(waiting=rnd.randrange(0, s), running=rnd.randrange(0, 2 * s), stale=rnd.random() < 0.1,
                updated_at=at, engine=engine)
    return Endpoint(f"{addr}:8000", addr, 8000, name=f"pod-{i}", metrics=m)


def scrape(model: LatencyModel, eps: list[Endpoint], rnd: random.Random, now: float) -> None:
    """Two scrapes of engines that decoded at their own speed: their fitted timings (or new ones)."""
    for step in (0, 1):
        batch = []
        for i, e in enumerate(eps):
            itl = rnd.uniform(0.004, 0.02)
            totals = EngineTotals(ttft=(0.0, 0.0), itl=(itl * 100 * (step + 1), 100.0 * (step + 1)),
                                  prompt_tokens=0.0, cached_tokens=0.0, requests=0.0)
            m = Metrics(running=1, stale=False, updated_at=now - 0.1 + 0.1 * step, engine=totals)
            batch.append(Endpoint(e.key, e.address, e.port, name=f"fit-{i}", metrics=m))
        model.scraped(batch, now)


class Scenario:
    """A latency model and a pool whose state moves between requests."""

    def __init__(self, n: int, seed: int) -> None:
        self.rnd = rnd = random.Random(seed)
        s = rnd.choice([4, 16])
        self.model = LatencyModel(ModelConfig(REF, max_num_seqs=s, eviction_weight=rnd.choice([0.0, 1.0, 2.5]),
                                              decode_weight=rnd.choice([0.0, 1.0]), calibration_alpha=0.3))
        self.s = s
        self.eps = [endpoint(i, rnd, s) for i in range(n)]
        if rnd.random() < 0.2:  # a key listed twice
            self.eps.append(self.eps[rnd.randrange(n)])
        fitted = rnd.choice([0.0, 0.3, 0.8, 1.0])
        scrape(self.model, [e for e in self.eps if rnd.random() < fitted], rnd, 0.0)
        self.now = 1.0

    def sample(self, share: float) -> list[str]:
        return [e.key for e in self.eps if self.rnd.random() < share]

    def request(self) -> tuple[float, dict[str, float], dict[str, InflightLoad], dict[str, int], int, dict[str, float]]:
        rnd = self.rnd
        tokens = float(rnd.choice([0, 7, 400, 4096, 20_000]))
        cached = {k: float(rnd.randrange(0, int(tokens * 1.2) + 1)) for k in self.sample(0.1)}
        inflight = {k: InflightLoad(rnd.randrange(0, 3 * self.s), 0) for k in self.sample(rnd.choice([0.0, 0.3, 1.0]))}
        room = {k: rnd.choice([rnd.randrange(0, int(tokens // 16) + 5), rnd.randrange(0, 40_000)])
                for k in self.sample(rnd.choice([0.0, 0.05, 0.5]))}
        default_room = rnd.choice([31_250, 31_250, 100])
        warm = {k: float(rnd.randrange(1, 5000)) for k in self.sample(0.05)}
        return tokens, cached, inflight, room, default_room, warm

    def move(self) -> None:
        """What happens between two decisions: picks, finished requests, scrapes, new metrics, departures."""
        rnd, model = self.rnd, self.model
        self.now += rnd.choice([0.002, 0.05, 1.0])
        for key in self.sample(0.05):
            chosen = model.picked(key, float(rnd.randrange(1, 8000)), float(rnd.randrange(0, 2000)), self.now)
            if rnd.random() < 0.7:
                model.finished(key, rnd.uniform(0.1, 5.0), chosen, rnd.randrange(0, 2 * self.s), 128)
        for key in self.sample(0.02):
            model.trust.belief[key] = rnd.uniform(0.2, 1.0)
        if rnd.random() < 0.15:
            scrape(model, [e for e in self.eps if rnd.random() < 0.2], rnd, self.now)
        if rnd.random() < 0.2:  # one endpoint's new metrics: a new snapshot in the list
            i = rnd.randrange(len(self.eps))
            e = self.eps[i]
            self.eps[i] = Endpoint(e.key, e.address, e.port, name=e.name,
                                   metrics=Metrics(waiting=rnd.randrange(0, 40), running=3, stale=False))
        if rnd.random() < 0.05:
            model.forget(self.eps[rnd.randrange(len(self.eps))].key)


@pytest.mark.parametrize("n", [1, 8, SMALL_POOL, SMALL_POOL + 1, 64, 512])
@pytest.mark.parametrize("seed", range(6))
def test_the_pass_equals_the_formula_endpoint_by_endpoint(n: int, seed: int) -> None:
    sc = Scenario(n, seed * 1000 + n)
    for _ in range(25):
        tokens, cached, inflight, room, default_room, warm = sc.request()
        cands = list(sc.eps)
        args = (tokens, cached, cands, inflight, sc.now, sc.rnd.choice([16, 128, 1024]), room, default_room, warm, 1.5)
        want = reference_costs(sc.model, *args)
        assert sc.model.costs(*args) == want
        assert sc.model.costs(*args) == want  # again, from what the pass kept
        low = {k: r for k, r in room.items() if r < LOW_ROOM}  # what the index's low_room() holds
        assert sc.model.costs(*args, low) == want
        sc.move()


def test_the_kinds_of_timings_follow_the_fits() -> None:
    """A pool moving from the reference timings to fitted ones (and the pool's mean for the rest) prices each
    endpoint by its current kind."""
    sc = Scenario(64, 7)
    model = sc.model
    for share in (0.0, 0.2, 0.6, 1.0):
        scrape(model, [e for e in sc.eps if sc.rnd.random() < share], sc.rnd, sc.now)
        for _ in range(3):
            tokens, cached, inflight, room, default_room, warm = sc.request()
            args = (tokens, cached, list(sc.eps), inflight, sc.now, 128, room, default_room, warm, 1.0)
            assert model.costs(*args) == reference_costs(model, *args)
            sc.move()


def _prompt(rnd: random.Random, systems: list[str], i: int) -> str:
    body = "".join(rnd.choice("abcdefgh ") for _ in range(48))
    return systems[i % len(systems)] + f"[turn {i}] " + body * rnd.randrange(1, 60)


@pytest.mark.parametrize("n", [8, 64, 512])
def test_the_default_profile_decides_as_with_the_reference(n: int) -> None:
    """The built-in default over a seeded workload (shared prefixes, in-flight requests, picks and finished
    requests), once with the pass and once with the reference formula in its place: the same picks."""
    rnd = random.Random(n)
    eps = [endpoint(i, rnd, 16) for i in range(n)]
    systems = ["".join(rnd.choice("ABCDEF \n") for _ in range(2048)) for _ in range(4)]
    reqs = [LLMRequest(f"r{i}", "m", "m", prompt=_prompt(rnd, systems, i)) for i in range(150)]
    scheds = [load_scheduler(None, rng=random.Random(3)) for _ in range(2)]
    scorer = next(p for p in scheds[1].plugins() if p.type_name == "estimated-latency-scorer")
    model = scorer.model
    model.costs = lambda *args: reference_costs(model, *args)
    picks: list[list[str]] = [[], []]
    for side, sched in enumerate(scheds):
        inflight: dict[str, InflightLoad] = {}
        running = []
        for i, req in enumerate(reqs):
            now = i * 0.01
            ctx = SchedulingContext(req, eps, dict(inflight), now=now)
            res = sched.schedule(ctx)
            sched.pre_request(ctx, res)
            key = res.targets[0].key
            picks[side].append(key)
            inflight[key] = InflightLoad(inflight.get(key, NO_LOAD).requests + 1, 0)
            running.append((ctx, res, key))
            if i % 3 == 2:  # the oldest finishes
                done_ctx, done_res, done_key = running.pop(0)
                sched.response_complete(SchedulingContext(done_ctx.request, eps, {}, now=now), done_res)
                inflight[done_key] = InflightLoad(inflight[done_key].requests - 1, 0)
    assert picks[0] == picks[1]
    assert len(set(picks[0])) > 1


def test_the_index_keeps_every_endpoint_short_of_room_in_low_room() -> None:
    """PrefixIndex.low_room() is room() below LOW_ROOM after records, capacity changes and departures."""
    rnd = random.Random(11)
    index = PrefixIndex(LOW_ROOM + 50)
    keys = [f"10.9.0.{i}:8000" for i in range(12)]
    for step in range(400):
        key = rnd.choice(keys)
        op = rnd.random()
        if op < 0.7:
            index.record(key, [rnd.randrange(1, 1 << 40) for _ in range(rnd.randrange(1, 256))], float(step))
        elif op < 0.9:
            index.set_capacity(key, rnd.randrange(1, 2 * LOW_ROOM))
        else:
            index.forget(key)
        assert dict(index.low_room()) == {k: r for k, r in index.room().items() if r < LOW_ROOM}
    assert index.low_room()  # the walk did reach endpoints short of room
