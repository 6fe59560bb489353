"""The scoring pass over a pool (`LatencyModel.costs`): cost(e) for every candidate as flat passes over per-pool
arrays, the formula of scheduling/plugins/scorers/estimated_latency.py operation for operation. A pool of at most
SMALL_POOL candidates does not come here: one loop prices it (small_pool.py).

What does not change between requests is kept per candidate list (a `PoolPlan`: the endpoints' keys, their fresh
load, each key's position), and per plan what the learnt timings make of each endpoint (k(e) on the reference
timings, or its fitted overhead, per-token and inter-token times), recomputed only when the learner's or the timing
table's version moves. A request then costs:

1. n(e): the plan's fresh loads, or max(in-flight requests, fresh load) in C-level passes (`map`) when requests
   are in flight;
2. the cost of an endpoint with no backlog, no predicted prefix hit and room for the prompt (most of a big pool):
   k(e) × (overhead + tokens × prefill per token + decode) on the reference timings, or
   overhead(e) + tokens × per token(e) + decode weight × output tokens × inter-token(e) on fitted ones, times
   slowdown(n(e)): C-level passes over the arrays, no Python code per endpoint;
3. the exceptions, one by one with the whole formula: an endpoint with a backlog, with a predicted hit, with too
   little room to take the prompt without evicting, or on timings of the pool's minority kind;
4. the wait for a slot where n(e) > maxNumSeqs − 1.
With no request in flight, n(e) is the plan's fresh loads, so their slowdowns and waits are kept with the plan too
(the waits until a D(e) moves): the request's own work is then three C-level operations per endpoint.

Each step evaluates the same operations in the same order as a per-endpoint evaluation, so the costs are equal to it
bit for bit (tests/scheduling/test_sched_pool_costs.py compares the two over random states).
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Iterable, Iterator, Mapping
from itertools import compress, repeat
from operator import add, attrgetter, mul
from typing import cast

from scheduling.api import NO_LOAD, InflightLoad
from scheduling.latency.backlog import SharedBacklog
from scheduling.latency.config import ModelConfig
from scheduling.latency.learner import Learner
from scheduling.latency.table import EngineTimingTable
from scheduling.latency.trust import TrustTable
from scheduling.prefix.index import LOW_ROOM
from scheduling.types import Endpoint

MAX_PLANS = 8  # candidate lists kept (one per pool, or per model's subset of a pool)
MAX_SLOW_N = 1 << 16  # slowdown(n) tabled up to here; a larger (or negative) n computes its own
REQUESTS = attrgetter("requests")


class PoolPlan:
    """One candidate list's arrays: keys, fresh loads, positions, and (per version of the learnt timings) each
    endpoint's timings as the dense pass reads them."""

    __slots__ = ("cands", "keys", "fresh", "lo", "hi", "pos", "all_odd", "stamp", "kinds_stamp", "scales_stamp", "fitted",
                 "kv", "ov", "uv", "iv", "odd", "fresh_slow", "fresh_wait", "wait_stamp")

    def __init__(self, cands: list[Endpoint]) -> None:
        self.cands = list(cands)
        self.keys = [e.key for e in cands]
        self.fresh = [e.metrics.fresh_load for e in cands]
        self.lo = min(self.fresh, default=0)
        self.hi = max(self.fresh, default=0)
        self.pos = {k: i for i, k in enumerate(self.keys)}
        self.all_odd = len(self.pos) < len(self.keys)  # a key listed twice: every endpoint by the whole formula
        self.stamp: tuple[float, ...] | None = None  # what `timings` last read
        self.kinds_stamp: tuple[int, ...] | None = None  # what `kinds` last read (versions, sizes, the pool's id)
        self.scales_stamp: tuple[float, ...] | None = None  # what `kv` was last computed from
        self.fitted = False  # the dense pass prices the fitted kind (else the reference kind)
        self.kv: array[float] = array("d")  # k(e) (reference kind)
        self.ov: array[float] = array("d")  # overhead, per token, inter-token (fitted kind)
        self.uv: array[float] = array("d")
        self.iv: array[float] = array("d")
        self.odd: list[int] = []  # positions of the other kind
        self.fresh_slow: array[float] | None = None  # slowdown(n(e)) of the fresh loads (no request in flight)
        self.fresh_wait: array[float] = array("d")  # the wait for a slot at the fresh loads, as of D(e)'s `wait_stamp`
        self.wait_stamp = -1

    def timings(self, learner: Learner, table: EngineTimingTable) -> None:
        """Brings the timings up to date with the learner and the table (each part when its inputs moved)."""
        stamp = (table.version, learner.version, learner.pool_scale, len(learner.scales), len(table.eff))
        if stamp == self.stamp:
            return
        self.stamp = stamp
        pool = table.pool
        kinds = (table.version, learner.version if pool is not None else -1, len(table.eff), id(pool),
                 len(learner.scales))
        if kinds != self.kinds_stamp:
            self.kinds(learner, table)
            self.kinds_stamp = kinds
        scales = (learner.version, learner.pool_scale, len(learner.scales))
        if not self.fitted and scales != self.scales_stamp:
            self.kv = array("d", map(learner.scales.get, self.keys, repeat(learner.pool_scale)))
            self.scales_stamp = scales

    def kinds(self, learner: Learner, table: EngineTimingTable) -> None:
        """Which endpoints are on fitted timings (their own, or the fitted endpoints' mean for one with neither a
        fit nor its own k) and which on the reference × k(e); the majority kind is priced densely."""
        keys = self.keys
        pool = table.pool
        if not table.eff and pool is None:
            self.fitted, self.odd = False, []
            self.scales_stamp = None
            return
        ts = list(map(table.eff.get, keys))
        if pool is not None:
            scaled = learner.scales
            ts = [pool if t is None and k not in scaled else t for t, k in zip(ts, keys, strict=True)]
        ref = [i for i, t in enumerate(ts) if t is None]
        self.fitted = 2 * len(ref) < len(keys)
        self.scales_stamp = None
        if self.fitted:
            self.odd = ref
            fits = [t or (0.0, 0.0, 0.0, 0.0) for t in ts]
            self.ov, self.uv, self.iv = (array("d", [t[j] for t in fits]) for j in range(3))
        else:
            self.odd = [i for i, t in enumerate(ts) if t is not None]

    def loads(self, inflight: Mapping[str, InflightLoad]) -> tuple[list[int], int, int]:
        """(n(e) per position: max(in-flight requests, fresh scraped load); a lower and an upper bound of them)."""
        if not inflight:
            return self.fresh, self.lo, self.hi
        if len(inflight) < len(self.keys) and not self.all_odd:  # walk the endpoints with requests in flight
            ns = self.fresh.copy()
            hi = self.hi
            pos_get = self.pos.get
            for key, load in inflight.items():
                i = pos_get(key)
                if i is not None:
                    r = load.requests
                    if r > ns[i]:
                        ns[i] = r
                        if r > hi:
                            hi = r
            return ns, self.lo, hi
        ns = [r if r > w else w
              for r, w in zip(map(REQUESTS, map(inflight.get, self.keys, repeat(NO_LOAD))), self.fresh, strict=True)]
        return ns, min(ns), max(ns)


class PoolCosts:
    """The latency model's scoring pass (module docstring) and the plans of the candidate lists it has seen."""

    def __init__(self, config: ModelConfig, slow: Mapping[int, float], backlog: SharedBacklog, learner: Learner,
                 timings: EngineTimingTable, trust: TrustTable) -> None:
        self.config = config
        self.backlog = backlog
        self.learner = learner
        self.table = timings
        self.trust = trust
        s1 = config.max_num_seqs - 1
        f1 = config.load_factor - 1.0
        full = slow[s1] if s1 in slow else 1.0 + f1 * s1 / s1
        self._slow_of = slow
        self._slow_full = full
        self.slow_by_n: list[float] = []  # slowdown(n) for n = 0 .. len − 1, as the formula's table gives it
        self.plans: dict[tuple[int, int, int], PoolPlan] = {}
        self.last: PoolPlan | None = None  # the plan of the previous request (most requests: the same pool)

    def slowdown(self, n: int) -> float:
        """slowdown(n) as the scoring pass computes it (the model's table, else the formula)."""
        s1 = self.config.max_num_seqs - 1
        got = self._slow_of.get(n)
        if got is not None:
            return got
        return self._slow_full if n > s1 else 1.0 + (self.config.load_factor - 1.0) * n / s1

    def slowdowns(self, ns: list[int], lo: int, hi: int) -> Iterator[float]:
        """slowdown(n) per n of `ns` (whose least and greatest are `lo` and `hi`), lazily."""
        table = self.slow_by_n
        if lo < 0 or hi >= MAX_SLOW_N:
            return map(self.slowdown, ns)
        if hi >= len(table):
            table.extend(self.slowdown(n) for n in range(len(table), 2 * hi + 1))
        return map(table.__getitem__, ns)

    def plan(self, cands: list[Endpoint]) -> PoolPlan:
        """The plan of this candidate list (the same endpoint snapshots in the same order), built when new."""
        plan = self.last
        if plan is None or plan.cands != cands:
            tag = (len(cands), id(cands[0]), id(cands[-1]))
            plan = self.plans.get(tag)
            if plan is None or plan.cands != cands:
                if plan is None and len(self.plans) >= MAX_PLANS:
                    del self.plans[next(iter(self.plans))]
                plan = self.plans[tag] = PoolPlan(cands)
            self.last = plan
        plan.timings(self.learner, self.table)
        return plan

    # ---- the pass ------------------------------------------------------------------------------------------
    def costs(self, tokens: float, cached: Mapping[str, float], candidates: list[Endpoint],
              inflight: Mapping[str, InflightLoad], now: float, out_tokens: int, room: Mapping[str, int | float],
              default_room: int | float, warm: Mapping[str, float], warm_weight: float,
              low: Mapping[str, int | float] | None = None) -> tuple[list[float], list[int]]:
        """cost(e) and n(e) per candidate (module docstring). `low`, when given, holds every entry of `room` below
        `LOW_ROOM` (the index's `low_room()`): a prompt of fewer blocks then reads it instead of every endpoint's room."""
        if not candidates:
            return [], []
        c = self.config
        ref = c.reference
        plan = self.plan(candidates)
        ns, lo, hi = plan.loads(inflight)
        base: Iterator[float]
        if plan.fitted:  # o + (β × 0 + tokens) × unit + decodeWeight × outputTokens × inter-token
            dw_out = c.decode_weight * out_tokens
            base = map(add, map(add, plan.ov, map(mul, repeat(tokens), plan.uv)), map(mul, repeat(dw_out), plan.iv))
        else:  # k × (overhead + tokens × per token + decode)
            plain = ref.overhead + tokens * ref.prefill_per_token + c.decode_weight * (ref.inter_token * out_tokens)
            base = map(mul, plan.kv, repeat(plain))
        fresh = ns is plan.fresh
        if fresh:
            if plan.fresh_slow is None:
                plan.fresh_slow = array("d", self.slowdowns(ns, lo, hi))
            costs = list(map(mul, base, plan.fresh_slow))
        else:
            costs = list(map(mul, base, self.slowdowns(ns, lo, hi)))
        need = -(-tokens // c.block_tokens)
        if low is not None and (need > LOW_ROOM or default_room < need):
            low = None  # the short ones are not all in `low`
        tight = bool(c.eviction_weight and tokens) and (
            default_room < need or any(map(need.__gt__, (room if low is None else low).values())))
        odd = self.exceptions(plan, cached, room, default_room, need if tight else None, low)
        if odd:
            evicting = self.exact(odd, plan.keys, ns, costs, tokens, cached, now, out_tokens, tight)
            if evicting:
                self.evict(evicting, plan.keys, costs, tokens, room, default_room, warm, warm_weight)
        if hi < c.max_num_seqs:
            return costs, ns
        if fresh:  # + 0.0 where n(e) ≤ S − 1 leaves the cost as it is
            return list(map(add, costs, self.fresh_waits(plan))), ns
        s1 = c.max_num_seqs - 1
        d_get = self.learner.durations.get
        initial = c.initial_request_seconds
        per_seq = c.max_num_seqs
        return [cost + (n - s1) * d_get(key, initial) / per_seq if n > s1 else cost
                for cost, n, key in zip(costs, ns, plan.keys, strict=True)], ns

    def fresh_waits(self, plan: PoolPlan) -> array[float]:
        """The wait for a slot at the plan's fresh loads, (n − S + 1) × D(e) / S where n(e) > S − 1 and 0.0
        elsewhere; kept until a D(e) moves."""
        learner = self.learner
        if plan.wait_stamp != learner.durations_version:
            c = self.config
            s1 = c.max_num_seqs - 1
            d_get = learner.durations.get
            initial = c.initial_request_seconds
            per_seq = c.max_num_seqs
            plan.fresh_wait = array("d", [(n - s1) * d_get(key, initial) / per_seq if n > s1 else 0.0
                                          for n, key in zip(plan.fresh, plan.keys, strict=True)])
            plan.wait_stamp = learner.durations_version
        return plan.fresh_wait

    def exceptions(self, plan: PoolPlan, cached: Mapping[str, float], room: Mapping[str, int | float],
                   default_room: int | float, need: float | None, low: Mapping[str, int | float] | None
                   ) -> Collection[int]:
        """Positions the dense pass does not price: the minority kind of timings, a backlog, a predicted hit, and
        (`need`: the prompt's blocks, when some endpoint may lack room for them) too little room, found in `low`
        (every endpoint short of `need`, when given) or in every endpoint's room."""
        if plan.all_odd:
            return range(len(plan.keys))
        pos_get = plan.pos.get
        found: set[int | None] = set(map(pos_get, self.backlog.queues()))
        if cached:
            found.update(map(pos_get, cached))
        found.discard(None)
        odd = cast(set[int], found)
        if plan.odd:
            odd.update(plan.odd)
        if need is not None and low is not None:
            short = [pos_get(k) for k, r in low.items() if r < need]
            odd.update(i for i in short if i is not None)
        elif need is not None:
            odd.update(compress(range(len(plan.keys)), map(need.__gt__, map(room.get, plan.keys, repeat(default_room)))))
        return odd

    def exact(self, odd: Iterable[int], keys: list[str], ns: list[int], costs: list[float], tokens: float,
              cached: Mapping[str, float], now: float, out_tokens: int, tight: bool
              ) -> list[tuple[int, float, float, float, bool]]:
        """cost(e) × slowdown(n(e)) at the positions `odd`, by the whole formula; returns what pricing their
        eviction needs, [(position, uncached, k, unit, hit predicted)], for those with uncached tokens when some
        endpoint may lack room for the prompt (`tight`; else none can: cached(e) ≥ 0, so uncached(e) ≤ tokens)."""
        c = self.config
        ref = c.reference
        pspt, overhead = ref.prefill_per_token, ref.overhead
        dw_out = c.decode_weight * out_tokens
        decode = c.decode_weight * (ref.inter_token * out_tokens)
        plain_pd = overhead + tokens * pspt + decode
        pool_k = self.learner.pool_scale
        scaled = self.learner.scales
        believed = self.trust.belief
        fit_get, fit_pool = self.table.eff.get, self.table.pool
        queue_get = self.backlog.queues().get
        slowdown = self.slowdown
        evict_w = tight and c.eviction_weight
        slow_tab, n_tab = self.slow_by_n, len(self.slow_by_n)
        evicting: list[tuple[int, float, float, float, bool]] = []
        for i in odd:
            key = keys[i]
            q = queue_get(key)
            cc = cached.get(key)
            if believed and cc is not None:
                b = believed.get(key)
                if b is not None:
                    cc *= b
            t = fit_get(key)
            if t is None and fit_pool is not None and key not in scaled:
                t = fit_pool
            uncached = tokens if cc is None else (tokens - cc if tokens > cc else 0.0)
            if t is None:  # the reference timings × k(e)
                k = scaled.get(key, pool_k)
                unit = pspt  # × k below (the reference path's arithmetic, bit for bit)
                if q is None and cc is None:
                    cost = k * plain_pd
                else:
                    backlog = 0.0
                    if q is not None:
                        backlog = q.total - (now - q.since) * (1.0 / (k * pspt))
                        if not backlog > 0.0:
                            backlog = 0.0
                    cost = k * (overhead + (backlog + uncached) * pspt + decode)
            else:  # fitted engine timings, the backlog weighed as finished requests taught
                k = 1.0
                o_e, unit, i_e, beta = t
                backlog = 0.0
                if q is not None:
                    backlog = q.total - (now - q.since) / unit
                    if not backlog > 0.0:
                        backlog = 0.0
                cost = o_e + (beta * backlog + uncached) * unit + dw_out * i_e
            n = ns[i]
            costs[i] = cost * (slow_tab[n] if 0 <= n < n_tab else slowdown(n))
            if evict_w and uncached:
                evicting.append((i, uncached, k, unit, cc is not None))
        return evicting

    def evict(self, evicting: list[tuple[int, float, float, float, bool]], keys: list[str], costs: list[float],
              tokens: float, room: Mapping[str, int | float], default_room: int | float, warm: Mapping[str, float],
              warm_weight: float) -> None:
        """Adds the price of the prefixes each endpoint would evict to take the prompt's uncached blocks (and of a
        waiting session's context among them)."""
        c = self.config
        block = c.block_tokens
        evict_w = c.eviction_weight
        plain_need = -(-tokens // block)
        for i, uncached, k, unit, hit in evicting:
            key = keys[i]
            over = (-(-uncached // block) if hit else plain_need) - room.get(key, default_room)
            if over > 0:
                cost = costs[i] + k * evict_w * over * block * unit
                warmed = warm.get(key)
                if warmed:  # evicting a waiting session's context: its next turn recomputes it for certain
                    cost += k * warm_weight * min(over * block, warmed) * unit
                costs[i] = cost
