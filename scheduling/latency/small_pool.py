"""The scoring pass over a small pool (`LatencyModel.costs` for at most SMALL_POOL candidates): the formula of
scheduling/plugins/scorers/estimated_latency.py evaluated endpoint by endpoint, in one loop.

A large pool is priced in flat passes over arrays kept per candidate list (pool.py); keeping those arrays current
(version stamps, plans, the exceptions' set) is a fixed cost per request that a handful of endpoints never earn back,
so a small pool, the common case of a single model's pods, takes this loop instead: nothing kept between requests,
nothing allocated but the two lists it returns. Both evaluate the same operations in the same order, so their costs
are equal bit for bit (tests/scheduling/test_sched_pool_costs.py compares each with the reference formula).
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduling.api import NO_LOAD, InflightLoad
from scheduling.latency.backlog import SharedBacklog
from scheduling.latency.config import ModelConfig
from scheduling.latency.learner import Learner
from scheduling.latency.table import EngineTimingTable
from scheduling.latency.trust import TrustTable
from scheduling.types import Endpoint

SMALL_POOL = 16  # candidate lists up to this long are priced here (measured: bench/bench_scheduler.py at 8 and 64)


class SmallPool:
    """cost(e) and n(e) per candidate of a small pool, endpoint by endpoint (module docstring)."""

    def __init__(self, config: ModelConfig, slow: Mapping[int, float], backlog: SharedBacklog, learner: Learner,
                 timings: EngineTimingTable, trust: TrustTable) -> None:
        c = config
        ref = c.reference
        s1 = c.max_num_seqs - 1
        f1 = c.load_factor - 1.0
        # What the loop reads of the settings, unpacked in one step per request.
        self.consts = (ref.prefill_per_token, ref.overhead, s1, f1, c.max_num_seqs, c.initial_request_seconds,
                       slow[s1] if s1 in slow else 1.0 + f1 * s1 / s1, c.decode_weight, ref.inter_token,
                       c.block_tokens, c.eviction_weight)
        self.config = config
        self.slow = slow
        self.backlog = backlog
        self.learner = learner
        self.timings = timings
        self.trust = trust

    def costs(self, tokens: float, cached: Mapping[str, float], candidates: list[Endpoint],
              inflight: Mapping[str, InflightLoad], now: float, out_tokens: int, room: Mapping[str, int | float],
              default_room: int | float, warm: Mapping[str, float], warm_weight: float
              ) -> tuple[list[float], list[int]]:
        """cost(e) and n(e) per candidate (an endpoint with no backlog and nothing cached: the shortest path)."""
        pspt, overhead, s1, f1, per_seq, initial, slow_full, dw, inter, block, evict_w = self.consts
        dw_out, decode = dw * out_tokens, dw * (inter * out_tokens)
        learner = self.learner
        pool_k, scaled, duration_get = learner.pool_scale, learner.scales, learner.durations.get
        believed = self.trust.belief  # endpoints whose predicted hits count for less than they say
        fit_get, fit_pool = self.timings.eff.get, self.timings.pool  # fitted timings, and their mean (the prior)
        queue_get, cached_get, slow_get, room_get = self.backlog.queues().get, cached.get, self.slow.get, room.get
        inflight_get = inflight.get if inflight else None
        plain_pd = overhead + tokens * pspt + decode  # no backlog, nothing cached: uncached = tokens
        costs: list[float] = []
        ns: list[int] = []
        for e in candidates:
            key = e.key
            n = inflight_get(key, NO_LOAD).requests if inflight_get is not None else 0
            w = e.metrics.fresh_load  # 0 when stale: n is never below 0, so max(n, 0) is n
            if w > n:
                n = w
            q = queue_get(key)
            cc = cached_get(key)
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
                    backlog = q.total - (now - q.since) * (1.0 / (k * pspt)) if q is not None else 0.0
                    if not backlog > 0.0:
                        backlog = 0.0
                    cost = k * (overhead + (backlog + uncached) * pspt + decode)
            else:  # fitted engine timings, the backlog weighed as finished requests taught
                k = 1.0
                o_e, unit, i_e, beta = t
                backlog = q.total - (now - q.since) / unit if q is not None else 0.0
                if not backlog > 0.0:
                    backlog = 0.0
                cost = o_e + (beta * backlog + uncached) * unit + dw_out * i_e
            slow = slow_get(n)
            cost *= slow if slow is not None else (slow_full if n > s1 else 1.0 + f1 * n / s1)
            if evict_w and uncached:
                over = -(-uncached // block) - room_get(key, default_room)
                if over > 0:
                    cost = self.evicting(cost, key, over, k, unit, warm, warm_weight)
            if n > s1:
                cost += (n - s1) * duration_get(key, initial) / per_seq
            costs.append(cost)
            ns.append(n)
        return costs, ns

    def evicting(self, cost: float, key: str, over: float, k: float, unit: float, warm: Mapping[str, float],
                 warm_weight: float) -> float:
        """`cost` plus the price of the prefixes `key` would evict to take the prompt's uncached blocks, `over` of
        them more than it has room for (and of a waiting session's context among them)."""
        block = self.config.block_tokens
        cost += k * self.config.eviction_weight * over * block * unit
        warmed = warm.get(key)
        if warmed:  # evicting a waiting session's context: its next turn recomputes it for certain
            cost += k * warm_weight * min(over * block, warmed) * unit
        return cost
