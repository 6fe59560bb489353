"""running-requests-size-scorer (Heimdall: running-requests-scorer): fewer running requests score higher.

score(e) = (maxR − r(e)) / (maxR − minR)   over the candidates, r = running requests
score(e) = 1.0 for all when maxR == minR
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.plugin import State
from scheduling.plugins.scorers._minmax import inverse_minmax
from scheduling.types import Endpoint


@register("running-requests-size-scorer")
class RunningRequestsScorer(Scorer[None]):
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        return inverse_minmax([e.metrics.running for e in candidates])
