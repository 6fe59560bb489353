"""prefix-cache-affinity-filter (llm-d): keep endpoints with a strong approximate prefix-cache hit.

ratio(e) = matched_blocks(e) / total_blocks          (the approximate prefix data; reads it, never writes it)
with probability explorationProbability (0.01, injected rng): keep all (exploration)
K = {e | ratio(e) ≥ threshold (0.80)};  result = K if K else all candidates
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import SchedulingContext
from scheduling.framework import Filter, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.prefix import PrefixReader
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    threshold: float = bounded(0.8, min=0.0, max=1.0)
    explorationProbability: float = bounded(0.01, min=0.0, max=1.0)
    blockSizeTokens: int = bounded(16, min=1)
    maxPrefixBlocksToMatch: int = bounded(256, min=1)


@register("prefix-cache-affinity-filter")
class PrefixCacheAffinityFilter(PrefixReader[Params], Filter[Params]):
    Params = Params

    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        p = self.params
        if p.explorationProbability > 0 and state["rng"].random() < p.explorationProbability:
            return candidates
        matches, total = self.prefix.matches(ctx, state)
        if not total or not matches:
            return candidates
        need = p.threshold * total
        kept = [e for e in candidates if matches.get(e.key, 0) >= need]
        return kept or candidates
