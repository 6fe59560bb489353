"""saturation-filter (low-queue filter): keep endpoints that are not saturated, or all if none qualify.

keep(e) = waiting(e) < queueThreshold (5)  and  kv_usage(e) < kvCacheThreshold (0.8)
result  = [e | keep(e)]  if any e qualifies  else  all candidates
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import SchedulingContext
from scheduling.framework import Filter, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    queueThreshold: int = bounded(5, min=0)
    kvCacheThreshold: float = bounded(0.8, min=0.0, max=1.0)


@register("saturation-filter")
class SaturationFilter(Filter[Params]):
    Params = Params

    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        q = self.params.queueThreshold
        kv = self.params.kvCacheThreshold
        kept = [e for e in candidates if e.metrics.waiting < q and e.metrics.kv_usage < kv]
        return kept or candidates
