"""The latency model's table of fitted engine timings: one `EndpointFit` (fit.py) per endpoint that exports latency
histograms, the backlog weight its finished requests teach, and the fitted endpoints' mean as the prior of the
others."""

from __future__ import annotations

from collections.abc import Callable

from scheduling.latency.fit import EndpointFit, Timings
from scheduling.types import EngineTotals

BACKLOG_WEIGHT_RANGE = (0.0, 1.5)  # what finished requests may make of the queued prefill's weight


class EngineTimingTable:
    """The latency model's fitted timings: one `EndpointFit` per endpoint that exports latency
    histograms, and, per fitted endpoint, the weight β(e) of the prefill backlog in its predicted time to first
    token, learnt from its finished requests (the second source).

    The engine's histograms measure its own timings, but not how much the prefill Pointsman queued on it delays a
    new request: a serial prefill queue would delay it by all of it (β = 1, the scorer's model and its start), an
    engine that prefills the queued requests together with the new one (batched, chunked prefill; modelsim) by
    much less. Each finished request whose modelled time included a backlog gives one sample

        β = (observed − wait − (overhead + uncached × per_token + outputTokens × inter_token) × slowdown)
            / (backlog × per_token × slowdown)

    (clamped to `BACKLOG_WEIGHT_RANGE`; an EWMA per endpoint and pool-wide).

    `eff[key]` = (overhead, prefill per token, inter-token, β) seconds: what the scoring pass reads. `pool` is their
    mean over the fitted endpoints, the prior for an endpoint not fitted yet; None until one is."""

    __slots__ = ("ref", "slowdown", "alpha", "fits", "weight", "pool_weight", "eff", "pool", "version")

    def __init__(self, reference: Timings, slowdown: Callable[[float], float], alpha: float) -> None:
        self.ref = reference
        self.slowdown = slowdown
        self.alpha = alpha
        self.fits: dict[str, EndpointFit] = {}
        self.weight: dict[str, float] = {}  # β(e)
        self.pool_weight = 1.0
        self.eff: dict[str, tuple[float, float, float, float]] = {}
        self.pool: tuple[float, float, float, float] | None = None
        self.version = 0  # moves when `pool` or an endpoint's fitted timings in `eff` change (the scoring pass's plans)

    def observe(self, key: str, totals: EngineTotals, running: float, now: float, waiting: float = 0.0) -> bool:
        """An endpoint's scrape; True when its timings changed (call `refresh_pool` after a batch)."""
        fit = self.fits.get(key)
        if fit is None:
            fit = self.fits[key] = EndpointFit(self.ref, self.slowdown)
        if not fit.observe(totals, running, now, waiting):
            return False
        self.refresh(key)
        return True

    def refresh(self, key: str) -> None:
        """Bring `eff[key]` up to date with the endpoint's fit and β(e)."""
        fit = self.fits.get(key)
        t = fit.timings if fit is not None else None
        before = self.eff.get(key)
        if t is None:
            if before is not None:
                del self.eff[key]
                self.version += 1
            return
        self.eff[key] = (t.overhead, t.prefill_per_token, t.inter_token, self.weight.get(key, self.pool_weight))
        if before is None or before[:3] != (t.overhead, t.prefill_per_token, t.inter_token):
            self.version += 1  # β alone moves nothing the plans keep

    def refresh_pool(self) -> None:
        before = self.pool
        fitted = [f.timings for f in self.fits.values() if f.timings is not None]
        if not fitted:
            self.pool = None
        else:
            n = len(fitted)
            self.pool = (sum(t.overhead for t in fitted) / n, sum(t.prefill_per_token for t in fitted) / n,
                         sum(t.inter_token for t in fitted) / n, self.pool_weight)
        if before is None or self.pool is None or before[:3] != self.pool[:3]:
            self.version += 1

    def fitted(self, key: str) -> Timings | None:
        fit = self.fits.get(key)
        return fit.timings if fit is not None else None

    def learn(self, key: str, sample: float) -> None:
        """A finished request's backlog-weight sample (see the class docstring)."""
        lo, hi = BACKLOG_WEIGHT_RANGE
        sample = min(hi, max(lo, sample))
        a = self.alpha
        self.weight[key] = (1 - a) * self.weight.get(key, self.pool_weight) + a * sample
        self.pool_weight = (1 - a) * self.pool_weight + a * sample
        self.refresh(key)

    def forget(self, key: str) -> None:
        self.fits.pop(key, None)
        self.weight.pop(key, None)
        self.eff.pop(key, None)
        self.version += 1

    def keys(self) -> set[str]:
        return set(self.fits) | set(self.weight)
