"""The latency model: the predicted cost of a request on each candidate (the scoring pass), its TTFT and TPOT (SLO
tiers, explain, reports), and what a pick and a finished request change. The formula is in
scheduling/plugins/scorers/estimated_latency.py's docstring (the scorer that reads the prefix data and hands it
here); the parts with their own state are the backlog (backlog.py), the learner (learner.py: D(e), k(e), with the
fitted engine timings of table.py) and the prefix trust (trust.py).

Pure: time is passed in; one model per scorer instance.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from scheduling.api import InflightLoad
from scheduling.latency.backlog import SharedBacklog
from scheduling.latency.config import ModelConfig
from scheduling.latency.learner import Chosen, Learner
from scheduling.latency.pool import PoolCosts
from scheduling.latency.small_pool import SMALL_POOL, SmallPool
from scheduling.latency.table import EngineTimingTable
from scheduling.latency.trust import TrustTable, TrustView
from scheduling.types import Endpoint

SLOW_TABLE = 4096  # slowdown values precomputed per n (maxNumSeqs beyond this computes the rest per endpoint)
PRUNE_EVERY = 256  # picks between two sweeps of drained backlogs (a power of two)


class ScoredPass(NamedTuple):
    """What one scoring pass saw, kept in the request's state for the pick and the finished request."""

    candidates: list[Endpoint]
    ns: list[int]  # n(e) per candidate
    tokens: float  # the prompt's tokens
    cached: Mapping[str, float]  # endpoint -> tokens it is expected to hold (before the trust's belief)
    now: float

    def n_of(self, key: str) -> tuple[Endpoint, int] | None:
        """`key`'s endpoint and n(e) as the pass saw them; None when it did not score it."""
        i = next((j for j, e in enumerate(self.candidates) if e.key == key), -1)
        return None if i < 0 else (self.candidates[i], self.ns[i])


@dataclass(frozen=True, slots=True)
class EndpointModel:
    """What the model believes about one endpoint (explain, `epp endpoints`, the dashboard)."""

    timings: str  # "engine" (fitted from its own metrics), "pool" (the fitted endpoints' mean), "reference"
    overhead_s: float  # as the scoring pass uses them
    prefill_per_token_s: float
    inter_token_s: float
    backlog_weight: float  # how much queued prefill delays a request (1: the reference model's serial queue)
    calibration: float  # reference timings: k(e) from finished requests; 1 on engine timings
    fitted_age_s: float | None  # since the engine's metrics last brought a measurement; None: never
    prefill_points: float
    decode_tokens: float
    engine_ttft_mean_s: float | None  # the engine's own TTFT over its last interval with first tokens
    engine_ttft_p90_s: float | None
    trust: TrustView


class LatencyModel:
    """One scorer's latency model: the shared prefill backlog, the learner, the fitted timings and the trust."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        c = config
        s1 = c.max_num_seqs - 1
        # slowdown(n) for n = 0 .. min(s1, SLOW_TABLE), computed once (other n: per endpoint, same formula)
        self.slow = {n: 1.0 + (c.load_factor - 1.0) * n / s1 for n in range(min(s1, SLOW_TABLE) + 1)}
        self.backlog = SharedBacklog()  # prefill tokens queued per endpoint, from this process and its peers
        self.timings = EngineTimingTable(c.reference, c.slowdown_at, c.calibration_alpha)
        self.learner = Learner(c, self.timings)
        self.trust = TrustTable(window=c.trust_window, agree=c.trust_agreement, floor=c.trust_floor)
        self.pool = PoolCosts(c, self.slow, self.backlog, self.learner, self.timings, self.trust)
        self.small = SmallPool(c, self.slow, self.backlog, self.learner, self.timings, self.trust)
        self.picks = 0

    # ---- the scoring pass ----------------------------------------------------------------------------------
    def costs(self, tokens: float, cached: Mapping[str, float], candidates: list[Endpoint],
              inflight: Mapping[str, InflightLoad], now: float, out_tokens: int, room: Mapping[str, int | float],
              default_room: int | float, warm: Mapping[str, float], warm_weight: float,
              low: Mapping[str, int | float] | None = None) -> tuple[list[float], list[int]]:
        """cost(e) and n(e) per candidate: for a small pool endpoint by endpoint (`SmallPool`, small_pool.py); for
        a larger one flat passes over the pool's arrays, the exceptions (a backlog, a predicted hit, an eviction) one
        by one (`PoolCosts`, pool.py; `low`: the room entries below `LOW_ROOM`, if known)."""
        if len(candidates) <= SMALL_POOL:
            return self.small.costs(tokens, cached, candidates, inflight, now, out_tokens, room, default_room, warm,
                                    warm_weight)
        return self.pool.costs(tokens, cached, candidates, inflight, now, out_tokens, room, default_room, warm,
                               warm_weight, low)

    def predict(self, candidates: Sequence[Endpoint], ns: Sequence[int], tokens: float,
                cached: Mapping[str, float], now: float) -> list[tuple[float, float]]:
        """(TTFT, TPOT) seconds the request is predicted on each candidate, from the same model as its cost: for
        SLO-aware picks, explain and reports only (the scoring pass keeps to its one number per endpoint)."""
        c = self.config
        s1 = c.max_num_seqs - 1
        queues = self.backlog.queues()
        belief = self.trust.belief
        timings_of = self.learner.timings_of
        duration = self.learner.duration
        out: list[tuple[float, float]] = []
        for e, n in zip(candidates, ns, strict=True):
            key = e.key
            uncached = max(0.0, tokens - cached.get(key, 0.0) * belief.get(key, 1.0))
            o, per, itl, beta, _, _ = timings_of(key)
            q = queues.get(key)
            backlog = max(0.0, q.total - (now - q.since) / per) if q is not None else 0.0
            slow = c.slowdown(n)
            wait = (n - s1) * duration(key) / c.max_num_seqs if n > s1 else 0.0
            out.append(((o + (beta * backlog + uncached) * per) * slow + wait, itl * slow))
        return out

    def predicted(self, scored: ScoredPass, key: str, out_tokens: int, now: float) -> float | None:
        """The request's predicted duration on `key` at `now` (TTFT after the backlog and the wait for a slot, plus
        the whole decode at the predicted TPOT) from the timings the pass `scored` used for it (engine, pool or
        reference) and the n(e) it saw; None when that pass did not score `key`."""
        seen = scored.n_of(key)
        if seen is None:
            return None
        ((ttft, tpot),) = self.predict([seen[0]], [seen[1]], scored.tokens, scored.cached, now)
        return float(ttft + tpot * out_tokens)

    # ---- a pick and its end --------------------------------------------------------------------------------
    def picked(self, key: str, tokens: float, predicted: float, now: float) -> Chosen:
        """A request of `tokens` prompt tokens, `predicted` of them cached, was sent to `key`: its uncached prefill
        joins the backlog. Returns what calibration needs of the pick, as the decision saw it (before this
        request's own prefill joins the backlog): its modelled prefill and decode on the base timings (fitted,
        else the reference), which of the two, and the endpoint's D(e)."""
        c = self.config
        if c.prefix_trust:
            self.trust.sent(key, tokens, predicted, now)
        uncached = max(0.0, tokens - predicted * self.trust.belief.get(key, 1.0))
        rate = self.learner.drain_rate(key)
        fitted = self.timings.fitted(key) if c.fit_engine_timings else None
        base = fitted or c.reference
        backlog = self.backlog.total(key, now, rate)
        if fitted is None:
            prefill = base.overhead + (backlog + uncached) * base.prefill_per_token
            queued = None
        else:  # on fitted timings the sample is the backlog's weight: its modelled time apart
            prefill = base.overhead + uncached * base.prefill_per_token
            queued = backlog * base.prefill_per_token
        chosen = Chosen(prefill, self.learner.duration(key), base.inter_token, queued)
        self.backlog.add(key, uncached, now, rate)
        self.picks += 1
        if not self.picks & (PRUNE_EVERY - 1):
            self.backlog.drop_drained(now, self.learner.drain_rate)
        return chosen

    def finished(self, key: str, seconds: float, chosen: Chosen | None, n: int | None, out_tokens: int) -> None:
        """A request picked here ran `seconds` on `key`; `chosen` and `n` are what its decision saw (None: not
        known, and it teaches only D(e))."""
        sample = None
        if self.config.calibrate and chosen is not None and n is not None:
            sample = self.learner.sample(chosen, n, seconds, out_tokens)
        self.learner.finished(key, seconds, sample, chosen is not None and chosen.queued is not None)

    # ---- the engines' metrics, and what the model shows ----------------------------------------------------
    def scraped(self, endpoints: Sequence[Endpoint], now: float) -> list[str]:
        """Scrapes arrived: fit the engines' timings from their histograms and feed their prefix-cache counters to
        the trust. Returns the endpoints whose trust to refresh (with prefix trust on)."""
        c = self.config
        table = self.timings
        changed = False
        refresh: list[str] = []
        for e in endpoints:
            m = e.metrics
            if m.engine is None or m.stale:
                continue
            at = m.updated_at if m.updated_at is not None else now
            if c.fit_engine_timings:
                changed = table.observe(e.key, m.engine, float(m.running), at, float(m.waiting)) or changed
            if c.prefix_trust:
                self.trust.engine(e.key, m.engine, at)
                refresh.append(e.key)
        if changed:
            table.refresh_pool()
        return refresh

    def endpoint_model(self, key: str, now: float, trust: TrustView) -> EndpointModel:
        """The timings the model uses for `key` (and where they come from), their age, and `trust`."""
        fit = self.timings.fits.get(key)
        view = fit.view() if fit is not None else None
        o, per, itl, beta, source, k = self.learner.timings_of(key)
        age = now - view.updated_at if view is not None and view.updated_at is not None else None
        return EndpointModel(source, o, per, itl, beta, k, age, view.prefill_points if view else 0.0,
                             view.decode_tokens if view else 0.0, view.ttft_mean if view else None,
                             view.ttft_p90 if view else None, trust)

    # ---- endpoints and peers -------------------------------------------------------------------------------
    def forget(self, key: str) -> None:
        """The endpoint left: everything known of it goes."""
        self.backlog.forget(key)
        self.learner.forget(key)
        self.timings.forget(key)
        self.timings.refresh_pool()
        self.trust.forget(key)

    def tracked(self) -> Collection[str]:
        return self.learner.keys() | self.backlog.endpoints() | self.timings.keys() | self.trust.entries.keys()

    def export_state(self, now: float) -> dict[str, float]:
        """This process's share of every endpoint's backlog."""
        return self.backlog.own(now, self.learner.drain_rate)

    def apply_peer_state(self, peer: str, values: Mapping[str, float] | None, now: float) -> None:
        self.backlog.set_peer(peer, values, now, self.learner.drain_rate)

