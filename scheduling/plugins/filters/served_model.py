"""served-model-filter: keep endpoints that serve the request's model.

keep(e) = e.models is empty  or  target_model ∈ e.models  or  lora_adapter ∈ e.models
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Filter, register
from scheduling.framework.plugin import State
from scheduling.types import Endpoint, serves


@register("served-model-filter")
class ServedModelFilter(Filter[None]):
    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        req = ctx.request
        target = req.target_model or req.model
        lora = req.lora_adapter
        return [e for e in candidates if serves(e, target, lora)]
