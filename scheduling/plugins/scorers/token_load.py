"""token-load-scorer: the picker's own in-flight prompt tokens per endpoint (ctx.inflight).

score(e) = 1 − min(1, inflight_tokens(e) / T),   T = queueThresholdTokens (4,194,304)
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
    queueThresholdTokens: int = bounded(4_194_304, min=1)


@register("token-load-scorer")
class TokenLoadScorer(Scorer[Params]):
    Params = Params
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        inv = 1.0 / self.params.queueThresholdTokens
        inflight = ctx.inflight
        return [1.0 - min(1.0, inflight.get(e.key, NO_LOAD).tokens * inv) for e in candidates]
