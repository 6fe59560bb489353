"""inflight-requests-scorer (Heimdall form): inverse min-max of the picker's own in-flight request count.

c(e)     = requests sent to e that have not finished (ctx.inflight)
score(e) = (maxC − c(e)) / (maxC − minC);  1.0 for all when maxC == minC
"""

from __future__ import annotations

from scheduling.api import NO_LOAD
from scheduling.framework import Scorer, register
from scheduling.plugins.scorers._minmax import inverse_minmax


@register("inflight-requests-scorer")
class InflightRequestsScorer(Scorer):
    clamped = True

    def score(self, ctx, candidates, state):
        inflight = ctx.inflight
        return inverse_minmax([inflight.get(e.key, NO_LOAD).requests for e in candidates])
