"""kv-cache-utilization-scorer (Heimdall: kv-utilization-scorer): free KV cache scores higher.

score(e) = 1 − kv_usage(e)        (kv_usage in [0, 1])
"""

from __future__ import annotations

from scheduling.framework import Scorer, register


@register("kv-cache-utilization-scorer")
class KvCacheUtilizationScorer(Scorer):
    def score(self, ctx, candidates, state):
        return [1.0 - e.metrics.kv_usage for e in candidates]
