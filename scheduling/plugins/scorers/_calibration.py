"""What the estimated-latency scorer learns from its own picks: the pick's record (`pre_request`: the prefill it
adds to the endpoint's backlog, the predicted prefix hit it sends, and what calibration needs of the decision), the
finished request (`response_complete`: D(e), and the calibration k(e), or on fitted engine timings the backlog's
weight β(e)), and the same from the records of peers (`snapshot_records`, `apply_records`: replication). Functions
of the scorer (bound as its methods in scheduling/plugins/scorers/estimated_latency.py, whose docstring gives the
model), kept apart from its scoring pass."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework.plugin import State
from scheduling.framework.replication import Record
from scheduling.plugins.scorers._timing_table import BACKLOG_WEIGHT_RANGE
from scheduling.plugins.scorers._timings import Timings
from scheduling.types import Endpoint

if TYPE_CHECKING:
    from scheduling.plugins.scorers.estimated_latency import EstimatedLatencyScorer

CALIBRATION_RANGE = (0.02, 50.0)
PRUNE_EVERY = 256  # picks between two sweeps of drained backlogs (a power of two)
MIN_BACKLOG_SHARE = 0.1  # a finished request teaches the backlog's weight when it was this much of its model
# What one request's scheduling state carries between the scorer's hooks:
_START = "estimated-latency.start"  # when it was picked (pre_request)
_PRED = "estimated-latency.pred"  # (candidates, n per candidate) of the last scoring pass
_INPUTS = "estimated-latency.inputs"  # (prompt tokens, endpoint -> cached tokens, now) of that pass, for `predicted`
_CHOSEN = "estimated-latency.chosen"  # (modelled prefill, D(e)) of the pick, from pre_request


def output_tokens(body: Mapping[str, Any] | None, default: int) -> int:
    """The request's own output budget, when it states one."""
    if body:
        for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            v = body.get(key)
            if isinstance(v, int) and v > 0:
                return v
    return default


def pre_request(s: EstimatedLatencyScorer, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
    if not result.targets:
        return
    chosen = result.targets[0]
    now = ctx.now
    tokens, cached, _ = s._cached(ctx, state, [chosen])
    predicted = cached.get(chosen.key, 0.0)
    p = s.params
    if p.prefixTrust:
        s.trust.sent(chosen.key, tokens, predicted, now)
    uncached = max(0.0, tokens - predicted * s.trust.belief.get(chosen.key, 1.0))
    rate = s._drain_rate(chosen.key)
    # What the calibration needs of the pick, as the decision saw it (before this request's own prefill joins
    # the backlog): its modelled prefill and decode on the base timings (fitted, else the reference), which of
    # the two, and the endpoint's D(e).
    fitted = s.timings.fitted(chosen.key) if p.fitEngineTimings else None
    base = fitted or Timings(p.overheadSeconds, p.prefillSecondsPerToken, p.interTokenSeconds)
    backlog = s._backlog.total(chosen.key, now, rate)
    if fitted is None:
        prefill = base.overhead + (backlog + uncached) * base.prefill_per_token
        queued = 0.0
    else:  # on fitted timings the sample is the backlog's weight: its modelled time apart
        prefill = base.overhead + uncached * base.prefill_per_token
        queued = backlog * base.prefill_per_token
    state[_CHOSEN] = (prefill, s._duration.get(chosen.key, p.initialRequestSeconds), base.inter_token,
                      queued if fitted is not None else None)
    s._backlog.add(chosen.key, uncached, now, rate)
    state[_START] = now
    s._picks += 1
    if not s._picks & (PRUNE_EVERY - 1):
        s._backlog.drop_drained(now, s._drain_rate)


def response_complete(s: EstimatedLatencyScorer, ctx: SchedulingContext, result: SchedulingResult,
                      state: State) -> None:
    start = state.get(_START)
    if start is None or not result.targets:
        return
    key = result.targets[0].key
    seconds = max(0.0, ctx.now - start)
    sample = s._sample(ctx, key, seconds, state) if s.params.calibrate else None
    chosen = state.get(_CHOSEN)
    on_fit = chosen is not None and chosen[3] is not None
    s._learn(key, seconds, sample, on_fit)
    if s._outbox is not None:
        s._outbox.append([key, seconds, -1.0 if sample is None else sample])


def learn(s: EstimatedLatencyScorer, key: str, seconds: float, sample: float | None,
          on_fit: bool | None = None) -> None:
    """One finished request on `key` (here or at a peer): its duration, and its calibration sample, taken on
    the fitted timings (`on_fit`; None: whatever this scorer has for `key` now) or on the reference's."""
    a = s.params.durationEwmaAlpha
    prev = s._duration.get(key)
    s._duration[key] = seconds if prev is None else (1 - a) * prev + a * seconds
    if sample is None:
        return
    if on_fit is None:
        on_fit = s.timings.fitted(key) is not None
    if on_fit:
        s.timings.learn(key, sample)
        return
    a = s.params.calibrationAlpha
    s._scale[key] = (1 - a) * s._scale.get(key, s.pool_scale) + a * sample
    s.pool_scale = (1 - a) * s.pool_scale + a * sample


def scored_as(state: State, key: str) -> tuple[Endpoint, int] | None:
    """`key`'s endpoint and its n(e) as the scoring pass that left `state` saw them; None when it did not score it."""
    pred: tuple[list[Endpoint], list[int]] | None = state.get(_PRED)
    if pred is None:
        return None
    candidates, ns = pred
    i = next((j for j, e in enumerate(candidates) if e.key == key), -1)
    return None if i < 0 else (candidates[i], ns[i])


def calibration_sample(s: EstimatedLatencyScorer, ctx: SchedulingContext, key: str, seconds: float,
                       state: State) -> float | None:
    """(observed − wait) / model for the request that ran on `key`, from what the decision saw: n(e) from the
    scoring pass, the modelled prefill and D(e) from pre_request."""
    chosen: tuple[float, float, float, float | None] | None = state.get(_CHOSEN)
    scored = scored_as(state, key)
    if chosen is None or scored is None:
        return None
    p = s.params
    s1 = p.maxNumSeqs - 1
    n = scored[1]
    prefill, duration, inter_token, queued = chosen
    full_decode = inter_token * output_tokens(ctx.request.body, p.defaultOutputTokens)
    slow = s.slowdown(n)
    model = (prefill + full_decode) * slow
    wait = (n - s1) * duration / p.maxNumSeqs if n > s1 else 0.0
    if queued is not None:  # fitted timings: the weight of the backlog (EngineTimingTable)
        if queued * slow < MIN_BACKLOG_SHARE * model:
            return None  # too little backlog to tell its weight
        lo, hi = BACKLOG_WEIGHT_RANGE
        return min(hi, max(lo, (seconds - wait - model) / (queued * slow)))
    if model <= 0.0:
        return None
    lo, hi = CALIBRATION_RANGE
    return min(hi, max(lo, (seconds - wait) / model))


def snapshot_records(s: EstimatedLatencyScorer, now: float) -> list[Record]:
    """What was learnt so far, for a peer that joins: [endpoint, D(e), k(e) or -1, 1]."""
    out: list[Record] = [[key, d, s._scale.get(key, -1.0), 1] for key, d in s._duration.items()]
    return out


def apply_records(s: EstimatedLatencyScorer, peer: str, records: Sequence[Record], now: float) -> int:
    """A peer's finished requests teach this scorer as its own do (so every replica calibrates on all of
    them); a snapshot fills in only what this scorer has not learnt itself."""
    bad = 0
    lo, hi = CALIBRATION_RANGE
    for rec in records:
        if not (3 <= len(rec) <= 4 and all(finite(v) for v in rec[1:]) and 0.0 <= rec[1] < 1e6
                and (rec[2] == -1.0 or 0.0 <= rec[2] <= hi)):
            bad += 1
            continue
        key, seconds, sample = rec[0], float(rec[1]), None if rec[2] == -1.0 else float(rec[2])
        if len(rec) == 3:
            s._learn(key, seconds, sample)
        elif key not in s._duration:
            s._duration[key] = seconds
            if sample is not None and key not in s._scale:
                s._scale[key] = sample
    return bad


def finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
