"""load-aware-scorer (llm-d): waiting-queue pressure against a fixed threshold T (queueThreshold, 128).

score(e) = 0.5                               if q(e) == 0
         = 0.5 × (1 − min(q(e), T) / T)      otherwise            (q = waiting requests)
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    queueThreshold: int = bounded(128, min=1)


@register("load-aware-scorer")
class LoadAwareScorer(Scorer[Params]):
    Params = Params
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        t = self.params.queueThreshold
        inv = 0.5 / t
        return [0.5 - min(q, t) * inv if (q := e.metrics.waiting) > 0 else 0.5 for e in candidates]
