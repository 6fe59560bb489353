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
    n(e)           = max(in-flight requests to e (exact) + outside(e), waiting(e) + running(e) from fresh metrics)
                     outside(e): at each scrape, the engine's waiting + running above Pointsman's own in-flight count
                     (requests that bypass it; scheduling/latency/outside.py; outsideLoad, on by default)
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

Calibration (calibrate, on by default; scheduling/latency/learner.py): the timing parameters describe a
reference engine, and the engines behind a pool are faster or slower. Every modelled time (overhead, prefill per
token, inter-token time, the backlog's drain) is multiplied by k(e), learnt from the requests that finish on e:
    sample = (observed duration − wait(e) at the pick) / ((overhead + (backlog + uncached) × prefillSecondsPerToken
              + outputTokens × interTokenSeconds) × slowdown(e))        clamped to [0.02, 50]
    k(e)   ← EWMA of the samples (calibrationAlpha, 0.05); an endpoint without samples uses the pool-wide EWMA k
So a fleet twice as fast as the reference converges to k = 0.5, and the trade between prefill, decode and queueing
(whose wait already comes from observed durations) stays right without hand-set timings.

Engine timings (fitEngineTimings, on by default; docs/latency-model.md): for an endpoint whose engine exports latency
histograms, overhead, prefillSecondsPerToken and interTokenSeconds are replaced by its own, fitted at every scrape
(the `engine_metrics` hook; scheduling/latency/fit.py), and its finished requests teach the weight β(e)
of its backlog instead of k(e) (ttft(e) uses β(e) × backlog(e)); an endpoint without its own fit or k uses the fitted
endpoints' mean. The reference path above is unchanged, bit for bit, for engines that export none.

Prefix trust (prefixTrust; scheduling/latency/trust.py): cached(e) is multiplied by the belief b(e) of the
endpoint's prefix state (exact 1; degraded after a KV-event disruption, or short of the engine's reported hits while
traffic bypasses Pointsman; approximate). SLO headers (sloAware; scheduling/latency/slo.py, tiers.py): the scores become
tiers by whether each candidate's predicted TTFT and TPOT meet the request's objectives (within sloHeadroom × the
objective first). SLO classes (scheduling/latency/classes.py): a request looser than the tightest objective stated
in the last sloClassWindowSeconds is placed as `loose` and pays sloYield × reserve(e) × its slack on top of cost(e),
so it leaves the endpoints the tight class can still use to the tight requests when a busier one meets its own
objective; sloYield 0 turns that off. When at most sloReserveShare of the candidates still have room for the tight
class, a sheddable loose request that would take one is shed (the shell's SLO shedding). sloHold: a loose request
whose pick is busy (a tight request there has not had its first token yet, or sloHoldShare × maxNumSeqs requests
are in flight there) is held back by the shell until it is not, for at most sloHoldSlack of its slack
(scheduling/latency/hold.py). Requests without headers are scored exactly as without SLOs.

The decode term is what makes the choice far-sighted: a busy batch slows every token of the request (and the
requests already there), so it spreads load before queues form, while a long uncached prefill still keeps a
request on the endpoint holding its prefix. decodeWeight 0 gives a pure time-to-first-token estimate. The
eviction term prices the prefixes a full endpoint would lose to make room (recomputed later by someone), so
under KV pressure hot prefixes are replicated only when the load gain pays for it.

Media (mediaDecodeWeight, 0.25 by default): a request that holds media (an image, audio, video or file part; the
shell sets `LLMRequest.media`) counts mediaDecodeWeight of its output tokens (rounded) in the decode term.
Its prefix is short in tokens (a system prompt and the item's placeholders) but comes back: the same image is sent
again on every turn of a conversation about it and by every user shown it, and it hits only where it was computed
(the engine's mm hash is in its blocks' keys). Traded against the whole decode term, such a short prefix loses to
a one-request difference in batch size, so the same image is computed on every endpoint in turn and the fleet
holds it several times; with a quarter of it, repeats gather where the image is cached while the batch sizes
still count (0 gathers as well but lets batches grow: later tokens slow down; the benchmark's
multimodal regime: docs/routing-benchmark.md). Requests without media are priced exactly as before.

The model itself is the core package scheduling/latency (`LatencyModel`); this plugin reads the prefix data, hands it
to the model, and keeps each request's scoring pass and pick in its state for the hooks that follow.

Like prefix-cache-scorer it produces the approximate prefix data for its blockSizeTokens (the producer records the
prompt's blocks after the pick); with prefixSource precise it also reads the precise prefix data and the request's
token ids (so the shell tokenizes the request; the approximate data stays the fallback). pre_request adds uncached(chosen) to the chosen endpoint's backlog;
response_complete feeds the request's duration into D; endpoint_removed drops both for a departed endpoint.

Replication (scheduling/framework/replication.py), so that several replicas model the engines as one would:
- the backlog is shared state: each process publishes its own share of every endpoint's backlog (absolute, as of
  the moment it publishes); a peer's shares join the same fluid queue, which drains at the engine's rate whoever
  sent the tokens (scheduling/latency/backlog.py);
- what finished requests teach (D(e) and the calibration k(e)) travels as records [endpoint, seconds, sample]: every
  replica learns from every request, so N replicas calibrate as fast as one (each learning from 1/N of the requests
  would leave the model uncalibrated N times longer, overestimating backlogs and spreading prefixes meanwhile).
The defaults are the reference vLLM profile (8B on H100: 250 µs per prompt token, 30 ms overhead, F = 2,
max-num-seqs 16, 12 ms per output token); set them in wall-clock seconds for the engines behind the pool.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.framework.replication import Record
from scheduling.latency import (
    LOOSE,
    PREDICTED,
    TIGHT_PLACEMENT,
    Chosen,
    EndpointModel,
    LatencyModel,
    ModelConfig,
    OutsideLoad,
    ScoredPass,
    SloClasses,
    Timings,
    TrustView,
    output_tokens,
    place,
    relative,
    slo_from_headers,
    slo_scores,
)
from scheduling.prefix import PrefixReader
from scheduling.prefix.precise import GPU, LIVE
from scheduling.prefix.precise_data import EVENTS, PreciseReader, PrefixHit, prefix_hits
from scheduling.sessions.warm import warm_board
from scheduling.types import Endpoint

__all__ = ["EstimatedLatencyScorer", "Params", "output_tokens"]


@dataclass(frozen=True)
class Params:
    prefillSecondsPerToken: float = bounded(250e-6, min=1e-9)
    overheadSeconds: float = bounded(0.03, min=0.0)
    loadFactor: float = bounded(2.0, min=1.0)
    maxNumSeqs: int = bounded(16, min=2)
    interTokenSeconds: float = bounded(0.012, min=0.0)
    defaultOutputTokens: int = bounded(128, min=0)
    decodeWeight: float = bounded(1.0, min=0.0)
    mediaDecodeWeight: float = bounded(0.25, min=0.0)
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
    sloYield: float = bounded(0.5, min=0.0)
    sloClassWindowSeconds: float = bounded(60.0, min=0.0)
    sloReserveShare: float = bounded(0.25, min=0.0, max=1.0)
    sloHold: bool = True
    sloHoldShare: float = bounded(0.5, min=0.0, max=1.0)
    sloHoldSlack: float = bounded(0.5, min=0.0, max=1.0)
    prefixSource: Literal["approximate", "precise"] = "approximate"
    outsideLoad: bool = True

    def model_config(self) -> ModelConfig:
        """The latency model's settings from these parameters."""
        return ModelConfig(
            Timings(self.overheadSeconds, self.prefillSecondsPerToken, self.interTokenSeconds), self.loadFactor,
            self.maxNumSeqs, self.defaultOutputTokens, self.decodeWeight, self.evictionWeight,
            self.initialRequestSeconds, self.durationEwmaAlpha, self.blockSizeTokens, self.calibrate,
            self.calibrationAlpha, self.fitEngineTimings, self.prefixTrust, self.trustWindowSeconds,
            self.trustAgreement, self.trustFloor)


def hold_rule(p: Params) -> tuple[int, float] | None:
    """How a loose request may be held (scheduling/latency/hold.py): None never; else (while its pick has tight work
    pending or at least this many requests in flight (0: tight work only), for at most this share of its slack)."""
    if not p.sloHold:
        return None
    return math.ceil(p.sloHoldShare * p.maxNumSeqs) if p.sloHoldShare > 0 else 0, p.sloHoldSlack


# What one request's scheduling state carries between the scorer's hooks:
PASS = "estimated-latency.pass"  # the last scoring pass (ScoredPass)
START = "estimated-latency.start"  # when it was picked (pre_request)
CHOSEN = "estimated-latency.chosen"  # what calibration needs of the pick (Chosen), from pre_request


@register("estimated-latency-scorer")
class EstimatedLatencyScorer(PreciseReader[Params], PrefixReader[Params], Scorer[Params]):
    Params = Params
    clamped = True
    produces_prefix = True

    @property
    def reads_precise(self) -> bool:
        return self.params.prefixSource == "precise"

    def setup(self, build: BuildContext) -> None:
        self.model = LatencyModel(self.params.model_config())
        self.classes = SloClasses(self.params.sloClassWindowSeconds)  # the objectives stated lately
        self._warm = warm_board(build.shared)  # sessions' protected KV, per endpoint (scheduling/sessions/warm.py)
        self.outside = OutsideLoad() if self.params.outsideLoad else None  # bypassing requests, from the scrapes

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
        p = self.params
        now = ctx.now
        tokens, cached, hits = self._cached(ctx, state, candidates)
        room = self._room(hits, candidates) if p.evictionWeight else {}
        index = self.prefix.index
        low = index.low_room() if room is index.room() else None  # not with the engines' own room merged in
        inflight = ctx.inflight if self.outside is None else self.outside.view(ctx.inflight)
        out = output_tokens(ctx.request.body, p.defaultOutputTokens)
        if ctx.request.media:  # a media request counts mediaDecodeWeight of its output in the decode term (see above)
            out = round(out * p.mediaDecodeWeight)
        costs, ns = self.model.costs(tokens, cached, candidates, inflight, now, out, room, index.default_capacity,
                                     self._warm.current(now), self._warm.weight, low)
        state[PASS] = ScoredPass(candidates, ns, tokens, cached, now)
        slo = slo_from_headers(ctx.request.headers) if p.sloAware else None
        if slo is None and not ctx.explain:
            return relative(costs)
        predicted = self.model.predict(candidates, ns, tokens, cached, now)
        state[PREDICTED] = {e.key: pr for e, pr in zip(candidates, predicted, strict=True)}
        if slo is None:
            return relative(costs)
        if not ctx.explain:
            self.classes.observe(slo, now)  # a dry run (explain) changes nothing
        klass, tight = self.classes.classify(slo, now)
        placement = TIGHT_PLACEMENT
        if klass == LOOSE and tight is not None:
            floors = self.model.predict(candidates, ns, 0.0, {}, now)  # what a request it holds entirely would get
            placement = place(slo, tight, [e.key for e in candidates], floors, p.sloHeadroom, p.sloYield,
                              p.sloReserveShare, hold_rule(p))
        return slo_scores(slo, candidates, costs, predicted, p.sloHeadroom, state, placement)

    # ---- what it learns from its picks ----------------------------------------------------------------------
    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        if not result.targets:
            return
        chosen = result.targets[0]
        tokens, cached, _ = self._cached(ctx, state, [chosen])
        state[CHOSEN] = self.model.picked(chosen.key, tokens, cached.get(chosen.key, 0.0), ctx.now)
        state[START] = ctx.now

    def response_complete(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        start = state.get(START)
        if start is None or not result.targets:
            return
        key = result.targets[0].key
        scored: ScoredPass | None = state.get(PASS)
        seen = scored.n_of(key) if scored is not None else None
        chosen: Chosen | None = state.get(CHOSEN)
        out = output_tokens(ctx.request.body, self.params.defaultOutputTokens)
        self.model.finished(key, max(0.0, ctx.now - start), chosen, seen[1] if seen else None, out)

    def predicted(self, ctx: SchedulingContext, state: State, key: str) -> float | None:
        """The request's predicted duration on `key` (seconds) as the scoring pass that left `state` modelled it;
        None when that pass did not model `key`. For reports (the shell's shadow profiles)."""
        scored: ScoredPass | None = state.get(PASS)
        if scored is None:
            return None
        out = output_tokens(ctx.request.body, self.params.defaultOutputTokens)
        return self.model.predicted(scored, key, out, ctx.now)

    # ---- what it learns from the engines, and what it shows -------------------------------------------------
    def engine_metrics(self, endpoints: Sequence[Endpoint], now: float) -> None:
        """Scrapes arrived: fit the engines' timings from their histograms and weigh their prefix-cache counters
        against the predicted hits; count the requests they run that Pointsman did not send."""
        if self.outside is not None:
            self.outside.scraped(endpoints, now)
        for key in self.model.scraped(endpoints, now):
            self.trust_view(key, now, refresh=True)

    def trust_view(self, key: str, now: float, refresh: bool = False) -> TrustView:
        """The prefix trust of `key` (exact / degraded / approximate) and the belief scoring gives its predicted
        hits; `refresh` also updates the belief the scoring pass reads."""
        precise = self.precise
        events = precise is not None and precise.index.state(key) == LIVE
        disrupted = precise.index.disrupted.get(key) if precise is not None else None
        trust = self.model.trust
        return trust.refresh(key, now, events, disrupted) if refresh else trust.view(key, now, events, disrupted)

    def endpoint_model(self, key: str, now: float) -> EndpointModel:
        """The timings this scorer uses for `key` (and where they come from), their age, and its prefix trust."""
        return self.model.endpoint_model(key, now, self.trust_view(key, now))

    def endpoint_removed(self, key: str) -> None:
        self.model.forget(key)
        if self.outside is not None:
            self.outside.forget(key)

    def tracked_endpoints(self) -> Collection[str]:
        return self.model.tracked()

    # ---- replication: the backlog is state, what finished requests taught travels as records -----------------
    def replication_key(self) -> str:
        return "estimated-latency"

    def export_state(self, now: float) -> dict[str, float]:
        return self.model.export_state(now)

    def apply_peer_state(self, peer: str, values: Mapping[str, float] | None, now: float) -> None:
        self.model.apply_peer_state(peer, values, now)

    def set_replicating(self, on: bool) -> None:
        self.model.learner.set_replicating(on)

    def export_records(self, now: float) -> list[Record]:
        """[endpoint, seconds, calibration sample or -1] per request that finished here since the last call."""
        return self.model.learner.export()

    def snapshot_records(self, now: float) -> list[Record]:
        """What was learnt so far, for a peer that joins: [endpoint, D(e), k(e) or -1, 1]."""
        return self.model.learner.snapshot()

    def apply_records(self, peer: str, records: Sequence[Record], now: float) -> int:
        """A peer's finished requests teach this scorer as its own do (so every replica calibrates on all of them);
        a snapshot fills in only what this scorer has not learnt itself."""
        return self.model.learner.apply(records)
