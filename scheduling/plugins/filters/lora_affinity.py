"""lora-affinity-filter: prefer endpoints that already have the request's LoRA adapter.

no adapter requested                      -> all candidates
A = {e | adapter ∈ active ∪ waiting}      -> A if not empty
R = {e | |active ∪ waiting| < max_lora}   -> R if not empty (room to load it)
otherwise                                 -> all candidates
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Filter, register
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@register("lora-affinity-filter")
class LoraAffinityFilter(Filter[None]):
    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        lora = ctx.request.lora_adapter
        if not lora:
            return candidates
        affine = [e for e in candidates if lora in e.metrics.active_loras or lora in e.metrics.waiting_loras]
        if affine:
            return affine
        room = [
            e
            for e in candidates
            if len(e.metrics.active_loras | e.metrics.waiting_loras) < e.metrics.max_lora
        ]
        return room or candidates
