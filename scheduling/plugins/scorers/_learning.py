"""What the estimated-latency scorer learns from the engines and what it shows of it: the engine-metrics hook
(fitted timings, scheduling/plugins/scorers/_timings.py; prefix trust, _trust.py), the timings it uses per endpoint,
the per-endpoint view for explain and `epp endpoints`, the TTFT / TPOT prediction for SLO-aware picks, and the
`predicted` duration for reports. Functions of the scorer, kept apart from its scoring pass."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from scheduling.api import SchedulingContext
from scheduling.framework.plugin import State
from scheduling.plugins.scorers._calibration import _INPUTS, output_tokens, scored_as
from scheduling.plugins.scorers._trust import EndpointModel, TrustView
from scheduling.prefix.precise import LIVE
from scheduling.types import Endpoint

if TYPE_CHECKING:
    from scheduling.plugins.scorers.estimated_latency import EstimatedLatencyScorer

REFERENCE, POOL, ENGINE = "reference", "pool", "engine"


def timings_of(s: EstimatedLatencyScorer, key: str) -> tuple[float, float, float, float, str, float]:
    """(overhead, prefill per token, inter-token, backlog weight, source, k) the scorer uses for `key`: its fitted
    timings, else the fitted endpoints' mean (an endpoint without its own k), else the reference × k(e)."""
    t = s.timings.eff.get(key)
    if t is not None:
        return (*t, ENGINE, 1.0)
    pool = s.timings.pool
    if pool is not None and key not in s._scale:
        return (*pool, POOL, 1.0)
    p = s.params
    k = s.scale(key)
    return k * p.overheadSeconds, k * p.prefillSecondsPerToken, k * p.interTokenSeconds, 1.0, REFERENCE, k


def engine_metrics(s: EstimatedLatencyScorer, endpoints: Sequence[Endpoint], now: float) -> None:
    """Scrapes arrived: fit the engines' timings from their histograms (scheduling/plugins/scorers/_timings.py)
    and weigh their prefix-cache counters against the predicted hits (scheduling/plugins/scorers/_trust.py)."""
    p = s.params
    table = s.timings
    changed = False
    for e in endpoints:
        m = e.metrics
        if m.engine is None or m.stale:
            continue
        at = m.updated_at if m.updated_at is not None else now
        if p.fitEngineTimings:
            changed = table.observe(e.key, m.engine, float(m.running), at, float(m.waiting)) or changed
        if p.prefixTrust:
            s.trust.engine(e.key, m.engine, at)
            trust_view(s, e.key, now, refresh=True)
    if changed:
        table.refresh_pool()


def endpoint_model(s: EstimatedLatencyScorer, key: str, now: float) -> EndpointModel:
    """The timings the scorer uses for `key` (and where they come from), their age, and its prefix trust."""
    fit = s.timings.fits.get(key)
    view = fit.view() if fit is not None else None
    o, per, itl, beta, source, k = timings_of(s, key)
    age = now - view.updated_at if view is not None and view.updated_at is not None else None
    return EndpointModel(source, o, per, itl, beta, k, age, view.prefill_points if view else 0.0,
                         view.decode_tokens if view else 0.0, view.ttft_mean if view else None,
                         view.ttft_p90 if view else None, trust_view(s, key, now))


def trust_view(s: EstimatedLatencyScorer, key: str, now: float, refresh: bool = False) -> TrustView:
    """The prefix trust of endpoint `key` (exact / degraded / approximate) and the belief scoring gives its
    predicted hits; `refresh` also updates the belief the scoring pass reads."""
    precise = s.precise
    events = precise is not None and precise.index.state(key) == LIVE
    disrupted = precise.index.disrupted.get(key) if precise is not None else None
    if refresh:
        return s.trust.refresh(key, now, events, disrupted)
    return s.trust.view(key, now, events, disrupted)


def predict(s: EstimatedLatencyScorer, ctx: SchedulingContext, candidates: list[Endpoint], ns: Sequence[int],
            tokens: float, cached: Mapping[str, float]) -> list[tuple[float, float]]:
    """(TTFT, TPOT) seconds the request is predicted on each candidate, from the same model as its cost: for SLO-aware
    picks and explain only (a second pass; the scoring pass keeps to its one number per endpoint)."""
    p = s.params
    now = ctx.now
    s1 = p.maxNumSeqs - 1
    queues = s._backlog.queues()
    belief = s.trust.belief
    out: list[tuple[float, float]] = []
    for e, n in zip(candidates, ns, strict=True):
        key = e.key
        uncached = max(0.0, tokens - cached.get(key, 0.0) * belief.get(key, 1.0))
        o, per, itl, beta, _, _ = timings_of(s, key)
        q = queues.get(key)
        backlog = max(0.0, q.total - (now - q.since) / per) if q is not None else 0.0
        slow = s.slowdown(n)
        wait = (n - s1) * s._duration.get(key, p.initialRequestSeconds) / p.maxNumSeqs if n > s1 else 0.0
        out.append(((o + (beta * backlog + uncached) * per) * slow + wait, itl * slow))
    return out


def predicted(s: EstimatedLatencyScorer, ctx: SchedulingContext, state: State, key: str) -> float | None:
    """The request's predicted duration on `key` (seconds: TTFT after the backlog and the wait for a slot, plus
    the whole decode at the predicted TPOT) from the timings scoring used for it (engine, pool or reference:
    `timings_of`), as modelled by the scoring pass that left `state`; None when that pass did not model `key`.
    For reports (the shell's shadow profiles): the pick uses `score`, and this recomputes one endpoint's model
    only when asked."""
    inputs: tuple[float, dict[str, float], float] | None = state.get(_INPUTS)
    scored = scored_as(state, key)
    if inputs is None or scored is None:
        return None
    tokens, cached, _ = inputs
    ((ttft, tpot),) = predict(s, ctx, [scored[0]], [scored[1]], tokens, cached)
    return float(ttft + tpot * output_tokens(ctx.request.body, s.params.defaultOutputTokens))

