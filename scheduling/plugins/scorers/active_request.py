"""active-request-scorer (llm-d form): the picker's own in-flight request count (ctx.inflight).

c(e)     = requests sent to e that have not finished
score(e) = 1.0                          if c(e) ≤ idleThreshold (default 0)
         = (maxC − c(e)) / maxC         otherwise, maxC = max c over the candidates
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import NO_LOAD, SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    idleThreshold: int = bounded(0, min=0)


@register("active-request-scorer")
class ActiveRequestScorer(Scorer[Params]):
    Params = Params
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        inflight = ctx.inflight
        counts = [inflight.get(e.key, NO_LOAD).requests for e in candidates]
        hi = max(counts)
        idle = self.params.idleThreshold
        if hi <= idle:
            return [1.0] * len(counts)
        inv = 1.0 / hi
        return [1.0 if c <= idle else (hi - c) * inv for c in counts]
