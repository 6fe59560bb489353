"""lora-affinity (Kthena): keep only the endpoints that serve the requested model or LoRA adapter.

    keep(e) = model ∈ served(e)         model: the name the client asked for
    served(e) = e.models (labels / annotation) ∪ adapters the engine reports active or waiting
    an endpoint that does not say what it serves (no models, no adapters) is kept: Pointsman reads an empty list
    as "serves whatever it is asked" (Kthena reads the model list from the engine's /v1/models)
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Filter, register
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@register("lora-affinity")
class KthenaLoraAffinity(Filter[None]):
    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        model = ctx.request.model
        out = []
        for e in candidates:
            m = e.metrics
            if not e.models and not m.active_loras and not m.waiting_loras:
                out.append(e)
            elif model in e.models or model in m.active_loras or model in m.waiting_loras:
                out.append(e)
        return out
