"""running-requests-size-scorer (Heimdall: running-requests-scorer): fewer running requests score higher.

score(e) = (maxR − r(e)) / (maxR − minR)   over the candidates, r = running requests
score(e) = 1.0 for all when maxR == minR
"""

from __future__ import annotations

from scheduling.framework import Scorer, register
from scheduling.plugins.scorers._minmax import inverse_minmax


@register("running-requests-size-scorer")
class RunningRequestsScorer(Scorer):
    clamped = True

    def score(self, ctx, candidates, state):
        return inverse_minmax([e.metrics.running for e in candidates])
