"""queue-scorer (Heimdall: waiting-requests-scorer): fewer waiting requests score higher.

score(e) = (maxQ − q(e)) / (maxQ − minQ)   over the candidates, q = waiting requests
score(e) = 1.0 for all when maxQ == minQ
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.plugin import State
from scheduling.plugins.scorers._minmax import inverse_minmax
from scheduling.types import Endpoint


@register("queue-scorer")
class QueueScorer(Scorer[None]):
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        return inverse_minmax([e.metrics.waiting for e in candidates])
