"""lora-affinity-scorer: prefer endpoints where the request's LoRA adapter is (or can be) loaded.

score(e) = 1.0   if adapter ∈ active(e)                        (running there)
         = 0.8   elif |active(e) ∪ waiting(e)| < max_lora(e)   (room to load it)
         = 0.6   elif adapter ∈ waiting(e)
         = 0.0   otherwise
score(e) = 1.0 for every endpoint when the request names no adapter (neutral)
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@register("lora-affinity-scorer")
class LoraAffinityScorer(Scorer[None]):
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        lora = ctx.request.lora_adapter
        if not lora:
            return [1.0] * len(candidates)
        out = []
        for e in candidates:
            m = e.metrics
            if lora in m.active_loras:
                out.append(1.0)
            elif len(m.active_loras | m.waiting_loras) < m.max_lora:
                out.append(0.8)
            elif lora in m.waiting_loras:
                out.append(0.6)
            else:
                out.append(0.0)
        return out
