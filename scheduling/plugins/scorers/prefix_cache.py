"""prefix-cache-scorer (approximate): how much of the prompt's prefix an endpoint is believed to hold.

The data comes from the approximate prefix producer for blockSizeTokens (16): chained hashes of
blockSizeTokens × CHARS_PER_TOKEN-character blocks, at most maxPrefixBlocksToMatch (256). This scorer produces that
data (GIE semantics): with no approx-prefix-cache-producer declared, the loader creates one with the producer
parameters set here (blockSizeTokens, maxPrefixBlocksToMatch, lruCapacityPerServer, autoTuneCapacity,
forgetAfterSeconds); plugins sharing the block size must agree on them.

    matched(e) = consecutive blocks from the start that e holds (the producer's index)
    x(e)       = matched(e) / total_blocks                         normalization "input" (GIE/llm-d default)
               = matched(e) / max over candidates of matched       normalization "longestPrefix" (Heimdall default)
    score(e)   = x(e)                                              transform "linear" (default)
               = 1 / (1 + e^(−k (x − x0))),  k = 14, x0 = 0.7     transform "logistic"
    (0 for every endpoint when nothing matches or the prompt is empty, for either transform)

The producer records the prompt's blocks for the chosen endpoint (and the P/D prefill endpoint) after the pick,
bounds each endpoint to lruCapacityPerServer (31,250) blocks (auto-tuned from the endpoint's cache geometry) and
forgets an endpoint when it leaves the pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scheduling.api import SchedulingContext
from scheduling.framework import BuildContext, Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.prefix import PrefixReader
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    blockSizeTokens: int = bounded(16, min=1)
    maxPrefixBlocksToMatch: int = bounded(256, min=1)
    lruCapacityPerServer: int = bounded(31_250, min=1)
    autoTuneCapacity: bool = True
    normalization: Literal["input", "longestPrefix"] | None = None
    transform: Literal["linear", "logistic"] = "linear"
    k: float = 14.0
    x0: float = bounded(0.7, min=0.0, max=1.0)
    forgetAfterSeconds: float = bounded(900.0, min=0.0)


@register("prefix-cache-scorer")
class PrefixCacheScorer(PrefixReader[Params], Scorer[Params]):
    Params = Params
    clamped = True
    produces_prefix = True

    def setup(self, build: BuildContext) -> None:
        p = self.params
        self.normalization = p.normalization or ("longestPrefix" if build.dialect == "heimdall" else "input")

    def _transform(self, x: float) -> float:
        p = self.params
        return 1.0 / (1.0 + math.exp(-p.k * (x - p.x0)))

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        p = self.params
        matches, total = self.prefix.matches(ctx, state)
        n = len(candidates)
        if not matches:
            return [0.0] * n
        if self.normalization == "input" and p.transform == "linear":
            inv = 1.0 / total
            scaled = {k: m * inv for k, m in matches.items()}.get
            return [scaled(e.key, 0.0) for e in candidates]
        get = matches.get
        raw = [get(e.key, 0) for e in candidates]
        denom = total if self.normalization == "input" else max(raw)
        if not denom:
            return [0.0] * n
        inv = 1.0 / denom
        if p.transform == "linear":
            return [m * inv for m in raw]
        return [self._transform(m * inv) for m in raw]
