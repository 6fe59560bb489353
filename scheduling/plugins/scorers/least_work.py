"""least-work-scorer (LLMKube's LoadAware balancing): the endpoint with the least work scores highest.

work(e)  = max(waiting(e) + running(e), inflight(e))   when the engine's metrics have been scraped (a vLLM/SGLang
                                                        profile), so requests sent since the last scrape count
         = inflight(e)                                  otherwise (requests this picker sent and not finished)
score(e) = (max work − work(e)) / (max work − min work);  1.0 for all when every endpoint has the same work
"""

from __future__ import annotations

from scheduling.api import NO_LOAD, SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.plugin import State
from scheduling.plugins.scorers._minmax import inverse_minmax
from scheduling.types import Endpoint


def work(e: Endpoint, inflight: int) -> int:
    m = e.metrics
    if m.updated_at is None:
        return inflight
    return max(m.waiting + m.running, inflight)


@register("least-work-scorer")
class LeastWorkScorer(Scorer[None]):
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        if not candidates:
            return []
        inflight = ctx.inflight
        return inverse_minmax([work(e, inflight.get(e.key, NO_LOAD).requests) for e in candidates])
