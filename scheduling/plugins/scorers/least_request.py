"""least-request (Kthena): prefer endpoints with the fewest requests this picker sent that the engine has not
started, and optionally drop endpoints whose engine queue is long.

    f(e)     = requests this EPP sent to e that have not finished (ctx.inflight, exact and without scrape lag)
    r(e)     = running requests the engine reports
    base(e)  = f(e) + 100 × max(f(e) − r(e), 0)          (dispatched but not yet running: queued in the engine)
    score(e) = (max base − base(e)) / max base            (1.0 everywhere when max base = 0)
    filter (enableFiltering, on by default as in Kthena's default config):
             keep e when waiting(e) < maxWaitingRequests (10)
Kthena scales scores to 0-100 integers; the ranking is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import NO_LOAD, SchedulingContext
from scheduling.framework import BuildContext, FilterScorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    maxWaitingRequests: int = bounded(10, min=1)
    enableFiltering: bool = True


@register("least-request")
class LeastRequest(FilterScorer[Params]):
    Params = Params
    clamped = True

    def setup(self, build: BuildContext) -> None:
        self.filtering_enabled = self.params.enableFiltering

    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        limit = self.params.maxWaitingRequests
        return [e for e in candidates if e.metrics.waiting < limit]

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        inflight = ctx.inflight
        bases = []
        for e in candidates:
            f = inflight.get(e.key, NO_LOAD).requests
            bases.append(f + 100 * max(f - e.metrics.running, 0))
        top = max(bases)
        if top <= 0:
            return [1.0] * len(candidates)
        return [(top - b) / top for b in bases]
