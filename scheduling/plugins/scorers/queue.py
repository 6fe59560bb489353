"""queue-scorer (Heimdall: waiting-requests-scorer): fewer waiting requests score higher.

score(e) = (maxQ − q(e)) / (maxQ − minQ)   over the candidates, q = waiting requests
score(e) = 1.0 for all when maxQ == minQ
"""

from __future__ import annotations

from scheduling.framework import Scorer, register
from scheduling.plugins.scorers._minmax import inverse_minmax


@register("queue-scorer")
class QueueScorer(Scorer):
    clamped = True

    def score(self, ctx, candidates, state):
        return inverse_minmax([e.metrics.waiting for e in candidates])
