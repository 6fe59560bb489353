"""estimated-latency-scorer (Pointsman): scores endpoints by the predicted latency of the request there, so prefix
affinity and load are traded in one currency (seconds) instead of by hand-tuned weights.

    tokens         = the request's prompt tokens (its token ids when tokenized, else characters / CHARS_PER_TOKEN)
    uncached(e)    = max(0, tokens − cached(e))
    cached(e)      = matched(e) × blockSizeTokens                       prefixSource "approximate" (default): the
                                                                        approximate prefix data
                   = the prefix hit's tokens (scheduling.prefix.precise_data): prefixSource "precise": blocks the
                     engine holds by its KV events, weighted by medium (GPU 1.0, CPU 0.8) with Pointsman's
                     speculative picks, where e's index is live; the approximate data elsewhere
    backlog(e)     = prefill tokens sent to e and not yet worked off; it drains at 1 / prefillSecondsPerToken
                     tokens per second (a fluid model of the engine's prefill queue)
    n(e)           = max(in-flight requests to e (exact), waiting(e) + running(e) from fresh metrics)
    slowdown(e)    = 1 + (loadFactor − 1) × min(n(e), maxNumSeqs − 1) / (maxNumSeqs − 1)
    wait(e)        = max(0, n(e) − maxNumSeqs + 1) × D(e) / maxNumSeqs   D(e): EWMA of request durations on e
    ttft(e)        = (overheadSeconds + (backlog(e) + uncached(e)) × prefillSecondsPerToken) × slowdown(e) + wait(e)
    decode(e)      = outputTokens × interTokenSeconds × slowdown(e)   outputTokens: the request's max_tokens
                                                                       (or max_completion_tokens), else defaultOutputTokens
    evict(e)       = evictionWeight × max(0, ⌈uncached(e) / blockSizeTokens⌉ − free(e)) × blockSizeTokens × prefillSecondsPerToken
                     free(e): blocks the prefix index believes e can still take before evicting another prefix
                     (precise and live: (num_gpu_blocks − blocks the engine holds) × engine block / blockSizeTokens)
                     + warmWeight × min(evicted tokens, warm(e)) × prefillSecondsPerToken    warm(e): tokens of
                     sessions waiting for their next turn on e (agent-session-scorer's warm board; none without it)
    cost(e)        = ttft(e) + decodeWeight × decode(e) + evict(e)
    score(e)       = min over candidates of cost / cost(e)                (the best endpoint scores 1)

Calibration (calibrate, on by default; scheduling/plugins/scorers/_calibration.py): the timing parameters describe a
reference engine, and the engines behind a pool are faster or slower. Every modelled time (overhead, prefill per
token, inter-token time, the backlog's drain) is multiplied by k(e), learnt from the requests that finish on e:
    sample = (observed duration − wait(e) at the pick) / ((overhead + (backlog + uncached) × prefillSecondsPerToken
              + outputTokens × interTokenSeconds) × slowdown(e))        clamped to [0.02, 50]
    k(e)   ← EWMA of the samples (calibrationAlpha, 0.05); an endpoint without samples uses the pool-wide EWMA k
So a fleet twice as fast as the reference converges to k = 0.5, and the trade between prefill, decode and queueing
(whose wait already comes from observed durations) stays right without hand-set timings.

Engine timings (fitEngineTimings, on by default; docs/latency-model.md): for an endpoint whose engine exports latency
histograms, overhead, prefillSecondsPerToken and interTokenSeconds are replaced by its own, fitted at every scrape
(the `engine_metrics` hook; scheduling/plugins/scorers/_timings.py), and its finished requests teach the weight β(e)
of its backlog instead of k(e) (ttft(e) uses β(e) × backlog(e)); an endpoint without its own fit or k uses the fitted
endpoints' mean. The reference path above is unchanged, bit for bit, for engines that export none.

Prefix trust (prefixTrust; scheduling/plugins/scorers/_trust.py): cached(e) is multiplied by the belief b(e) of the
endpoint's prefix state (exact 1; degraded after a KV-event disruption, or short of the engine's reported hits while
traffic bypasses Pointsman; approximate). SLO headers (sloAware; scheduling/slo.py, _slo.py): the scores become
tiers by whether each candidate's predicted TTFT and TPOT meet the request's objectives.

The decode term is what makes the choice far-sighted: a busy batch slows every token of the request (and the
requests already there), so it spreads load before queues form, while a long uncached prefill still keeps a
request on the endpoint holding its prefix. decodeWeight 0 gives a pure time-to-first-token estimate. The
eviction term prices the prefixes a full endpoint would lose to make room (recomputed later by someone), so
under KV pressure hot prefixes are replicated only when the load gain pays for it.

Like prefix-cache-scorer it produces the approximate prefix data for its blockSizeTokens (the producer records the
prompt's blocks after the pick); with prefixSource precise it also reads the precise prefix data and the request's
token ids (so the shell tokenizes the request; the approximate data stays the fallback). pre_request adds uncached(chosen) to the chosen endpoint's backlog;
response_complete feeds the request's duration into D; endpoint_removed drops both for a departed endpoint.

Replication (scheduling/framework/replication.py), so that several replicas model the engines as one would:
- the backlog is shared state: each process publishes its own share of every endpoint's backlog (absolute, as of
  the moment it publishes); a peer's shares join the same fluid queue, which drains at the engine's rate whoever
  sent the tokens (scheduling/plugins/scorers/_backlog.py);
- what finished requests teach (D(e) and the calibration k(e)) travels as records [endpoint, seconds, sample]: every
  replica learns from every request, so N replicas calibrate as fast as one (each learning from 1/N of the requests
  would leave the model uncalibrated N times longer, overestimating backlogs and spreading prefixes meanwhile).
The defaults are the reference vLLM profile (8B on H100: 250 µs per prompt token, 30 ms overhead, F = 2,
max-num-seqs 16, 12 ms per output token); set them in wall-clock seconds for the engines behind the pool.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from scheduling.api import NO_LOAD, SchedulingContext
from scheduling.framework import BuildContext, Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.framework.replication import Record, drain
from scheduling.plugins.scorers import _calibration, _learning
from scheduling.plugins.scorers._backlog import SharedBacklog
from scheduling.plugins.scorers._calibration import _INPUTS, _PRED, output_tokens
from scheduling.plugins.scorers._learning import (
    endpoint_model,
    engine_metrics,
    predict,
    timings_of,
    trust_view,
)
from scheduling.plugins.scorers._slo import PREDICTED, slo_scores
from scheduling.plugins.scorers._slo import predictions as predictions  # for explain
from scheduling.plugins.scorers._timing_table import EngineTimingTable
from scheduling.plugins.scorers._timings import Timings
from scheduling.plugins.scorers._trust import EndpointModel, TrustTable, TrustView
from scheduling.prefix import PrefixReader
from scheduling.prefix.precise import GPU
from scheduling.prefix.precise_data import EVENTS, PreciseReader, PrefixHit, prefix_hits
from scheduling.sessions.warm import warm_board
from scheduling.slo import slo_from_headers
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    prefillSecondsPerToken: float = bounded(250e-6, min=1e-9)
    overheadSeconds: float = bounded(0.03, min=0.0)
    loadFactor: float = bounded(2.0, min=1.0)
    maxNumSeqs: int = bounded(16, min=2)
    interTokenSeconds: float = bounded(0.012, min=0.0)
    defaultOutputTokens: int = bounded(128, min=0)
    decodeWeight: float = bounded(1.0, min=0.0)
    evictionWeight: float = bounded(1.0, min=0.0)
    initialRequestSeconds: float = bounded(1.0, min=0.0)
    durationEwmaAlpha: float = bounded(0.1, min=0.0, max=1.0)
    blockSizeTokens: int = bounded(16, min=1)
    maxPrefixBlocksToMatch: int = bounded(256, min=1)
    lruCapacityPerServer: int = bounded(31_250, min=1)
    calibrate: bool = True
    calibrationAlpha: float = bounded(0.05, min=0.0, max=1.0)
    fitEngineTimings: bool = True
    prefixTrust: bool = True
    trustWindowSeconds: float = bounded(30.0, min=0.0)
    trustAgreement: float = bounded(0.8, min=0.0, max=1.0)
    trustFloor: float = bounded(0.2, min=0.0, max=1.0)
    sloAware: bool = True
    sloHeadroom: float = bounded(0.8, min=0.0, max=1.0)
    prefixSource: Literal["approximate", "precise"] = "approximate"


SLOW_TABLE = 4096  # slowdown values precomputed per n (maxNumSeqs beyond this computes the rest per endpoint)
MAX_OUTBOX = 4096  # finished requests kept for the bus between two exports


@register("estimated-latency-scorer")
class EstimatedLatencyScorer(PreciseReader[Params], PrefixReader[Params], Scorer[Params]):
    Params = Params
    clamped = True
    produces_prefix = True

    @property
    def reads_precise(self) -> bool:
        return self.params.prefixSource == "precise"

    def setup(self, build: BuildContext) -> None:
        self._backlog = SharedBacklog()  # prefill tokens queued per endpoint, from this process and its peers
        self._duration: dict[str, float] = {}  # endpoint -> EWMA of request seconds
        self._scale: dict[str, float] = {}  # endpoint -> calibration factor k(e)
        self.pool_scale = 1.0  # the pool-wide calibration factor (prior for endpoints without samples)
        self._picks = 0
        self._outbox: deque[Record] | None = None  # finished requests for the bus, while replicating
        self._warm = warm_board(build.shared)  # sessions' protected KV, per endpoint (scheduling/sessions/warm.py)
        p = self.params
        s1 = p.maxNumSeqs - 1
        # slowdown(n) for n = 0 .. min(s1, SLOW_TABLE), computed once (other n: per endpoint, same formula)
        self._slow = {n: 1.0 + (p.loadFactor - 1.0) * n / s1 for n in range(min(s1, SLOW_TABLE) + 1)}
        # engine timings fitted from the engines' histograms (scheduling/plugins/scorers/_timings.py)
        self.timings = EngineTimingTable(Timings(p.overheadSeconds, p.prefillSecondsPerToken, p.interTokenSeconds),
                                         self.slowdown_at, p.calibrationAlpha)
        # how much a predicted prefix hit is believed, per endpoint (scheduling/plugins/scorers/_trust.py)
        self.trust = TrustTable(window=p.trustWindowSeconds, agree=p.trustAgreement, floor=p.trustFloor)

    def slowdown(self, n: int) -> float:
        """slowdown(e) for n(e) = n requests."""
        p = self.params
        s1 = p.maxNumSeqs - 1
        return 1.0 + (p.loadFactor - 1.0) * min(n, s1) / s1

    def slowdown_at(self, n: float) -> float:
        """slowdown for a mean of n other requests (fractional: an interval's mean batch)."""
        p = self.params
        s1 = p.maxNumSeqs - 1
        return 1.0 + (p.loadFactor - 1.0) * min(max(0.0, n), s1) / s1

    def scale(self, key: str) -> float:
        """k(e): how much slower (> 1) or faster (< 1) than the reference engine this endpoint has proved."""
        return self._scale.get(key, self.pool_scale)

    def _per_token(self, key: str) -> float:
        """Prefill seconds per token on endpoint `key`: fitted, else the fitted endpoints' mean, else the reference
        × k(e)."""
        return timings_of(self, key)[1]

    # ---- what it learns from the engines, and what it shows (scheduling/plugins/scorers/_learning.py) -------
    def engine_metrics(self, endpoints: Sequence[Endpoint], now: float) -> None:
        """Scrapes arrived: fit the engines' timings from their histograms and weigh their prefix-cache counters
        against the predicted hits."""
        engine_metrics(self, endpoints, now)

    def endpoint_model(self, key: str, now: float) -> EndpointModel:
        """The timings this scorer uses for `key` (and where they come from), their age, and its prefix trust."""
        return endpoint_model(self, key, now)

    def trust_view(self, key: str, now: float, refresh: bool = False) -> TrustView:
        """The prefix trust of `key`; `refresh` also updates the belief the scoring pass reads."""
        return trust_view(self, key, now, refresh)

    def _drain_rate(self, key: str) -> float:
        """Prefill tokens per second endpoint `key` works off."""
        return 1.0 / self._per_token(key)

    def _cached(
        self, ctx: SchedulingContext, state: State, candidates: list[Endpoint]
    ) -> tuple[float, dict[str, float], dict[str, PrefixHit]]:
        """(prompt tokens, endpoint -> prompt tokens it is expected to hold, the precise hits when read)."""
        tokens = float(ctx.request.estimated_tokens)
        if not tokens:
            return 0.0, {}, {}
        if self.precise is not None:
            hits = prefix_hits(ctx, state, candidates, self.precise, self.prefix)
            return tokens, {k: h.tokens for k, h in hits.items()}, hits
        matches, _total = self.prefix.matches(ctx, state)
        block = self.params.blockSizeTokens
        return tokens, {k: float(m * block) for k, m in matches.items()}, {}

    def _room(self, hits: Mapping[str, PrefixHit], candidates: list[Endpoint]) -> Mapping[str, int | float]:
        """Endpoint -> blocks (of blockSizeTokens) it can take before evicting a cached prefix: the approximate
        index's room, or for an endpoint priced from its KV events (precise and live), (num_gpu_blocks − blocks the
        engine holds) × engine block / blockSizeTokens."""
        room: Mapping[str, int | float] = self.prefix.index.room()
        precise = self.precise
        if precise is None or not hits:
            return room
        size = precise.index.size
        bt = self.params.blockSizeTokens
        events: dict[str, int | float] = {}
        for e in candidates:
            m = e.metrics
            hit = hits.get(e.key)
            if hit is not None and hit.source == EVENTS and m.num_gpu_blocks and m.block_size:
                events[e.key] = (m.num_gpu_blocks - size(e.key, GPU)) * m.block_size / bt
        return {**room, **events} if events else room

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        """One pass over the candidates; everything that does not depend on the endpoint is computed once per
        request, and an endpoint with no backlog and no cached prefix (most of a big pool) takes the shortest path.
        The loop keeps each endpoint's n (the calibration's input) and nothing else."""
        p = self.params
        now = ctx.now
        tokens, cached, hits = self._cached(ctx, state, candidates)
        pspt = p.prefillSecondsPerToken
        overhead = p.overheadSeconds
        block = p.blockSizeTokens
        s1 = p.maxNumSeqs - 1
        f1 = p.loadFactor - 1.0
        dw_out = p.decodeWeight * output_tokens(ctx.request.body, p.defaultOutputTokens)
        decode = p.decodeWeight * (p.interTokenSeconds * output_tokens(ctx.request.body, p.defaultOutputTokens))
        evict_w = p.evictionWeight
        per_seq = p.maxNumSeqs
        initial = p.initialRequestSeconds
        pool_k = self.pool_scale
        scale_get = self._scale.get
        believed = self.trust.belief  # endpoints whose predicted hits count for less than they say
        belief_get = believed.get
        fit_get = self.timings.eff.get  # endpoints with fitted engine timings: (overhead, per token, inter-token)
        fit_pool = self.timings.pool  # their mean: the prior of an endpoint with neither a fit nor its own k
        scaled = self._scale
        duration_get = self._duration.get
        queue_get = self._backlog.queues().get
        cached_get = cached.get
        inflight = ctx.inflight
        inflight_get = inflight.get
        room = self._room(hits, candidates) if evict_w else {}
        room_get = room.get
        warm_get = self._warm.current(now).get  # sessions' protected tokens (agent-session-scorer), usually empty
        warm_w = self._warm.weight
        default_room = self.prefix.index.default_capacity
        # An endpoint with no backlog and nothing cached: uncached = tokens (backlog + uncached = tokens exactly).
        plain_pd = overhead + tokens * pspt + decode
        plain_need = -(-tokens // block)
        slow_get = self._slow.get
        slow_full = self._slow[s1] if s1 <= SLOW_TABLE else 1.0 + f1 * s1 / s1
        costs: list[float] = []
        ns: list[int] = []
        for e in candidates:
            key = e.key
            n = inflight_get(key, NO_LOAD).requests if inflight else 0
            w = e.metrics.fresh_load  # 0 when stale: n is never below 0, so max(n, 0) is n
            if w > n:
                n = w
            q = queue_get(key)
            c = cached_get(key)
            if believed and c is not None:
                b = belief_get(key)
                if b is not None:
                    c *= b
            t = fit_get(key)
            if t is None and fit_pool is not None and key not in scaled:
                t = fit_pool
            if t is None:  # the reference timings × k(e)
                k = scale_get(key, pool_k)
                unit = pspt  # × k below (the reference path's arithmetic, bit for bit)
                if q is None and c is None:
                    uncached = tokens
                    cost = k * plain_pd
                else:
                    uncached = tokens if c is None else (tokens - c if tokens > c else 0.0)
                    backlog = 0.0
                    if q is not None:
                        backlog = q.total - (now - q.since) * (1.0 / (k * pspt))
                        if not backlog > 0.0:
                            backlog = 0.0
                    cost = k * (overhead + (backlog + uncached) * pspt + decode)
            else:  # fitted engine timings, the backlog weighed as finished requests taught
                k = 1.0
                o_e, unit, i_e, beta = t
                uncached = tokens if c is None else (tokens - c if tokens > c else 0.0)
                backlog = 0.0
                if q is not None:
                    backlog = q.total - (now - q.since) / unit
                    if not backlog > 0.0:
                        backlog = 0.0
                cost = o_e + (beta * backlog + uncached) * unit + dw_out * i_e
            slow = slow_get(n)
            cost *= slow if slow is not None else (slow_full if n > s1 else 1.0 + f1 * n / s1)
            if evict_w and uncached:
                over = (plain_need if c is None else -(-uncached // block)) - room_get(key, default_room)
                if over > 0:
                    cost += k * evict_w * over * block * unit
                    warm = warm_get(key)
                    if warm:  # evicting a waiting session's context: its next turn recomputes it for certain
                        cost += k * warm_w * min(over * block, warm) * unit
            if n > s1:
                cost += (n - s1) * duration_get(key, initial) / per_seq
            costs.append(cost)
            ns.append(n)
        state[_PRED] = (candidates, ns)
        state[_INPUTS] = (tokens, cached, now)
        slo = slo_from_headers(ctx.request.headers) if p.sloAware else None
        if slo is None and not ctx.explain:
            return relative(costs)
        predicted = predict(self, ctx, candidates, ns, tokens, cached)
        state[PREDICTED] = {e.key: pr for e, pr in zip(candidates, predicted, strict=True)}
        if slo is None:
            return relative(costs)
        return slo_scores(slo, candidates, costs, predicted, p.sloHeadroom, state)

    # ---- what it learns from its picks (scheduling/plugins/scorers/_calibration.py; functions bound as methods) ---
    pre_request = _calibration.pre_request
    response_complete = _calibration.response_complete
    _learn = _calibration.learn
    _sample = _calibration.calibration_sample
    # the request's predicted duration on one endpoint, for reports (scheduling/plugins/scorers/_learning.py)
    predicted = _learning.predicted

    def endpoint_removed(self, key: str) -> None:
        self._backlog.forget(key)
        self._duration.pop(key, None)
        self._scale.pop(key, None)
        self.timings.forget(key)
        self.timings.refresh_pool()
        self.trust.forget(key)

    def tracked_endpoints(self) -> Collection[str]:
        return (self._backlog.endpoints() | self._duration.keys() | self._scale.keys() | self.timings.keys()
                | self.trust.entries.keys())

    # ---- replication -------------------------------------------------------------------------------------
    def replication_key(self) -> str:
        return "estimated-latency"

    def export_state(self, now: float) -> dict[str, float]:
        return self._backlog.own(now, self._drain_rate)

    def apply_peer_state(self, peer: str, values: Mapping[str, float] | None, now: float) -> None:
        self._backlog.set_peer(peer, values, now, self._drain_rate)

    def set_replicating(self, on: bool) -> None:
        self._outbox = deque(maxlen=MAX_OUTBOX) if on else None

    def export_records(self, now: float) -> list[Record]:
        """[endpoint, seconds, calibration sample or -1] per request that finished here since the last call."""
        return drain(self._outbox)

    # what finished requests taught, to and from peers (scheduling/plugins/scorers/_calibration.py)
    snapshot_records = _calibration.snapshot_records
    apply_records = _calibration.apply_records


def relative(costs: list[float]) -> list[float]:
    """score(e) = min over candidates of cost / cost(e): the best endpoint scores 1."""
    best = min(costs)
    if best <= 0.0:
        return [1.0 if c <= 0.0 else 0.0 for c in costs]
    return [best / c for c in costs]

