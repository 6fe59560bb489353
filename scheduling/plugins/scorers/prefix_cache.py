"""prefix-cache-scorer (approximate): how much of the prompt's prefix an endpoint is believed to hold.

Hashing (scheduling.prefix.hashing): block = blockSizeTokens (16) × 4 characters, chained xxhash64 with
seed xxh64(model ‖ cache_salt), trailing partial block included, at most maxPrefixBlocksToMatch (256) blocks.

    matched(e) = consecutive blocks from the start that e holds (shared per-scheduler index)
    x(e)       = matched(e) / total_blocks                         normalization "input" (GIE/llm-d default)
               = matched(e) / max over candidates of matched       normalization "longestPrefix" (Heimdall default)
    score(e)   = x(e)                                              transform "linear" (default)
               = 1 / (1 + e^(−k (x − x0))),  k = 14, x0 = 0.7     transform "logistic"
    (0 for every endpoint when nothing matches or the prompt is empty, for either transform)

pre_request records the prompt's blocks for the chosen endpoint (and the P/D prefill endpoint). Each endpoint
keeps at most lruCapacityPerServer (31,250) blocks, auto-tuned to num_gpu_blocks × block_size / blockSizeTokens
when the endpoint's metrics report both. Endpoints that are neither candidates nor chosen for
forgetAfterSeconds (900) are forgotten (checked every 256 decisions), as is an endpoint the shell reports gone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scheduling.framework import Scorer, register
from scheduling.framework.params import bounded
from scheduling.prefix import cycle_matches, record_choice, shared_index


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
class PrefixCacheScorer(Scorer):
    Params = Params
    clamped = True

    def setup(self, build):
        p = self.params
        self.index = shared_index(build.shared, p.blockSizeTokens, p.lruCapacityPerServer)
        self.normalization = p.normalization or ("longestPrefix" if build.dialect == "heimdall" else "input")
        self._calls = 0

    def _transform(self, x: float) -> float:
        p = self.params
        return 1.0 / (1.0 + math.exp(-p.k * (x - p.x0)))

    def score(self, ctx, candidates, state):
        p = self.params
        matches, total = cycle_matches(ctx, state, self.index, p.blockSizeTokens, p.maxPrefixBlocksToMatch)
        n = len(candidates)
        self._calls += 1
        if not self._calls & 255 and p.forgetAfterSeconds > 0:
            self._collect(candidates, ctx.now)
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

    def _collect(self, candidates, now: float) -> None:
        """Every 256th decision: endpoints neither candidates nor recorded into for forgetAfterSeconds
        (pods that left) are dropped, so pod churn cannot grow the index."""
        self.index.seen((e.key for e in candidates), now)
        self.index.forget_idle(now, self.params.forgetAfterSeconds)

    def forget_endpoint(self, key: str) -> None:
        self.index.forget(key)

    def pre_request(self, ctx, result, state):
        p = self.params
        record_choice(ctx, state, self.index, p.blockSizeTokens, p.maxPrefixBlocksToMatch,
                      (result.targets[0] if result.targets else None, result.prefill),
                      auto_tune=p.autoTuneCapacity)
