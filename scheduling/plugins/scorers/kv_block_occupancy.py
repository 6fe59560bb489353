"""kv-block-occupancy-scorer (Heimdall's kv-cache-utilization-scorer): endpoints holding fewer reusable cached
blocks score higher.

    held(e)  = blocks the approximate prefix index believes e holds, in engine blocks:
               index_blocks(e) × blockSizeTokens / block_size(e)   (block_size unknown -> blockSizeTokens)
    score(e) = 1 − min(1, held(e) / gpuKvCacheBlocks(e))           gpuKvCacheBlocks = Metrics.num_gpu_blocks
    score(e) = 0.5 (neutral) when num_gpu_blocks is unknown or 0
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.prefix import PrefixReader
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    blockSizeTokens: int = bounded(16, min=1)
    neutralScore: float = bounded(0.5, min=0.0, max=1.0)


@register("kv-block-occupancy-scorer")
class KvBlockOccupancyScorer(PrefixReader[Params], Scorer[Params]):
    Params = Params
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        size = self.prefix.index.size
        bt = self.params.blockSizeTokens
        neutral = self.params.neutralScore
        out = []
        for e in candidates:
            total = e.metrics.num_gpu_blocks
            if not total:
                out.append(neutral)
                continue
            held = size(e.key) * bt / (e.metrics.block_size or bt)
            out.append(1.0 - min(1.0, held / total))
        return out
