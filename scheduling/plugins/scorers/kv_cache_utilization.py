"""kv-cache-utilization-scorer (Heimdall: kv-utilization-scorer; Kthena: gpu-usage): free KV cache scores higher.

score(e) = 1 − kv_usage(e)        (kv_usage in [0, 1])
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@register("kv-cache-utilization-scorer")
class KvCacheUtilizationScorer(Scorer[None]):
    clamped = True  # out-of-range kv_usage is clamped here

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        kvs = [e.metrics.kv_usage for e in candidates]
        if min(kvs) >= 0.0 and max(kvs) <= 1.0:
            return [1.0 - k for k in kvs]
        return [1.0 - k if 0.0 <= k <= 1.0 else (0.0 if k > 1.0 else 1.0) for k in kvs]
