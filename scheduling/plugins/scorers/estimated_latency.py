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
    cost(e)        = ttft(e) + decodeWeight × decode(e) + evict(e)
    score(e)       = min over candidates of cost / cost(e)                (the best endpoint scores 1)

Calibration (calibrate, on by default): the timing parameters describe a reference engine, and the engines behind a
pool are faster or slower. Every modelled time (overhead, prefill per token, inter-token time, the backlog's drain)
is multiplied by k(e), learnt from the requests that finish on e:
    sample = (observed duration − wait(e) at the pick) / ((overhead + (backlog + uncached) × prefillSecondsPerToken
              + outputTokens × interTokenSeconds) × slowdown(e))        clamped to [0.02, 50]
    k(e)   ← EWMA of the samples (calibrationAlpha, 0.05); an endpoint without samples uses the pool-wide EWMA k
So a fleet twice as fast as the reference converges to k = 0.5, and the trade between prefill, decode and queueing
(whose wait already comes from observed durations) stays right without hand-set timings.

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

import math
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from scheduling.api import NO_LOAD, SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.framework.replication import Record, drain
from scheduling.plugins.scorers._backlog import SharedBacklog
from scheduling.prefix import PrefixReader
from scheduling.prefix.precise import GPU
from scheduling.prefix.precise_data import EVENTS, PreciseReader, PrefixHit, prefix_hits
from scheduling.types import Endpoint

_START = "estimated-latency.start"


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
    prefixSource: Literal["approximate", "precise"] = "approximate"


CALIBRATION_RANGE = (0.02, 50.0)
MAX_OUTBOX = 4096  # finished requests kept for the bus between two exports
_PRED = "estimated-latency.pred"


def output_tokens(body: Mapping[str, Any] | None, default: int) -> int:
    """The request's own output budget, when it states one."""
    if body:
        for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            v = body.get(key)
            if isinstance(v, int) and v > 0:
                return v
    return default


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
        self._outbox: deque[Record] | None = None  # finished requests for the bus, while replicating

    def scale(self, key: str) -> float:
        """k(e): how much slower (> 1) or faster (< 1) than the reference engine this endpoint has proved."""
        return self._scale.get(key, self.pool_scale)

    def _backlog_at(self, key: str, now: float, k: float) -> float:
        return self._backlog.total(key, now, 1.0 / (k * self.params.prefillSecondsPerToken))

    def _drain_rate(self, key: str) -> float:
        """Prefill tokens per second endpoint `key` works off."""
        return 1.0 / (self.scale(key) * self.params.prefillSecondsPerToken)

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

    def _free_blocks(self, e: Endpoint, hit: PrefixHit | None) -> float:
        """Blocks (of blockSizeTokens) e can take before evicting a cached prefix."""
        m = e.metrics
        if hit is not None and hit.source == EVENTS and self.precise is not None and m.num_gpu_blocks and m.block_size:
            held = self.precise.index.size(e.key, GPU)
            return (m.num_gpu_blocks - held) * m.block_size / self.params.blockSizeTokens
        index = self.prefix.index
        return float(index.capacity(e.key) - index.size(e.key))

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        p = self.params
        now = ctx.now
        tokens, cached, hits = self._cached(ctx, state, candidates)
        block = p.blockSizeTokens
        s1 = p.maxNumSeqs - 1
        f1 = p.loadFactor - 1.0
        inflight = ctx.inflight
        full_decode = p.interTokenSeconds * output_tokens(ctx.request.body, p.defaultOutputTokens)
        decode = p.decodeWeight * full_decode
        evict_w = p.evictionWeight
        costs = []
        models: list[float] = []  # per candidate, in reference-engine seconds: the calibration's denominator
        waits: list[float] = []
        for e in candidates:
            k = self._scale.get(e.key, self.pool_scale)
            n = inflight.get(e.key, NO_LOAD).requests
            m = e.metrics
            if not m.stale:
                n = max(n, m.waiting + m.running)
            uncached = max(0.0, tokens - cached.get(e.key, 0.0))
            prefill = p.overheadSeconds + (self._backlog_at(e.key, now, k) + uncached) * p.prefillSecondsPerToken
            slow = 1.0 + f1 * min(n, s1) / s1
            cost = k * (prefill + decode) * slow
            if evict_w and uncached:
                free = self._free_blocks(e, hits.get(e.key))
                over = -(-uncached // block) - free
                if over > 0:
                    cost += k * evict_w * over * block * p.prefillSecondsPerToken
            wait = 0.0
            if n > s1:
                wait = (n - s1) * self._duration.get(e.key, p.initialRequestSeconds) / p.maxNumSeqs
                cost += wait
            costs.append(cost)
            models.append((prefill + full_decode) * slow)
            waits.append(wait)
        state[_PRED] = (candidates, models, waits)
        best = min(costs)
        if best <= 0.0:
            return [1.0 if c <= 0.0 else 0.0 for c in costs]
        return [best / c for c in costs]

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        if not result.targets:
            return
        chosen = result.targets[0]
        now = ctx.now
        tokens, cached, _ = self._cached(ctx, state, [chosen])
        uncached = max(0.0, tokens - cached.get(chosen.key, 0.0))
        self._backlog.add(chosen.key, uncached, now, self._drain_rate(chosen.key))
        state[_START] = now

    def response_complete(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        start = state.get(_START)
        if start is None or not result.targets:
            return
        key = result.targets[0].key
        seconds = max(0.0, ctx.now - start)
        pred = state.get(_PRED)
        sample = self._sample(key, seconds, pred) if self.params.calibrate and pred is not None else None
        self._learn(key, seconds, sample)
        if self._outbox is not None:
            self._outbox.append([key, seconds, -1.0 if sample is None else sample])

    def _learn(self, key: str, seconds: float, sample: float | None) -> None:
        """One finished request on `key` (here or at a peer): its duration, and its calibration sample."""
        a = self.params.durationEwmaAlpha
        prev = self._duration.get(key)
        self._duration[key] = seconds if prev is None else (1 - a) * prev + a * seconds
        if sample is not None:
            a = self.params.calibrationAlpha
            self._scale[key] = (1 - a) * self._scale.get(key, self.pool_scale) + a * sample
            self.pool_scale = (1 - a) * self.pool_scale + a * sample

    def _sample(self, key: str, seconds: float, pred: tuple[list[Endpoint], list[float], list[float]]) -> float | None:
        candidates, models, waits = pred
        i = next((j for j, e in enumerate(candidates) if e.key == key), -1)
        if i < 0:
            return None
        model = models[i]
        if model <= 0.0:
            return None
        lo, hi = CALIBRATION_RANGE
        return min(hi, max(lo, (seconds - waits[i]) / model))

    def predicted(self, state: State, key: str) -> float | None:
        """The request's predicted duration on `key` (seconds: ttft + the whole decode, calibrated, plus the wait)
        as modelled by the run that left `state`; None when that run did not model `key`. For reports (the shell's
        shadow profiles); the pick uses `score`."""
        pred = state.get(_PRED)
        if pred is None:
            return None
        candidates, models, waits = pred
        for i, e in enumerate(candidates):
            if e.key == key:
                return float(self.scale(key) * models[i] + waits[i])
        return None

    def endpoint_removed(self, key: str) -> None:
        self._backlog.forget(key)
        self._duration.pop(key, None)
        self._scale.pop(key, None)

    def tracked_endpoints(self) -> Collection[str]:
        return self._backlog.endpoints() | self._duration.keys() | self._scale.keys()

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

    def snapshot_records(self, now: float) -> list[Record]:
        """What was learnt so far, for a peer that joins: [endpoint, D(e), k(e) or -1, 1]."""
        out: list[Record] = [[key, d, self._scale.get(key, -1.0), 1] for key, d in self._duration.items()]
        return out

    def apply_records(self, peer: str, records: Sequence[Record], now: float) -> int:
        """A peer's finished requests teach this scorer as its own do (so every replica calibrates on all of
        them); a snapshot fills in only what this scorer has not learnt itself."""
        bad = 0
        lo, hi = CALIBRATION_RANGE
        for rec in records:
            if not (3 <= len(rec) <= 4 and all(_finite(v) for v in rec[1:]) and 0.0 <= rec[1] < 1e6
                    and (rec[2] == -1.0 or lo <= rec[2] <= hi)):
                bad += 1
                continue
            key, seconds, sample = rec[0], float(rec[1]), None if rec[2] == -1.0 else float(rec[2])
            if len(rec) == 3:
                self._learn(key, seconds, sample)
            elif key not in self._duration:
                self._duration[key] = seconds
                if sample is not None and key not in self._scale:
                    self._scale[key] = sample
        return bad


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
