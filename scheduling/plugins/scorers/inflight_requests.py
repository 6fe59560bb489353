"""inflight-requests-scorer (Heimdall form): inverse min-max of the picker's own in-flight request count.

c(e)     = requests sent to e that have not finished (ctx.inflight)
score(e) = (maxC − c(e)) / (maxC − minC);  1.0 for all when maxC == minC
"""

from __future__ import annotations

from scheduling.api import NO_LOAD, SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.plugin import State
from scheduling.plugins.scorers._minmax import inverse_minmax
from scheduling.types import Endpoint


@register("inflight-requests-scorer")
class InflightRequestsScorer(Scorer[None]):
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        inflight = ctx.inflight
        return inverse_minmax([inflight.get(e.key, NO_LOAD).requests for e in candidates])
