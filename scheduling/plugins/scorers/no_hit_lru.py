"""no-hit-lru-scorer (llm-d): spread cold requests (no prefix hit anywhere) over the least recently cold-hit pods.

warm request (some candidate holds ≥ 1 prefix block):  score(e) = 0.5 for all
cold request: endpoints never given a cold request score 1.0; the c candidates in the LRU, ordered from
              least to most recently given a cold request at position p = 0..c−1, score (c − p) / (c + 1)
pre_request: on a cold request, the chosen endpoint moves to the most-recent end (LRU of lruSize, 1024)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.prefix import PrefixReader
from scheduling.types import Endpoint

_COLD = "no-hit-lru.cold"


@dataclass(frozen=True)
class Params:
    lruSize: int = bounded(1024, min=1)
    blockSizeTokens: int = bounded(16, min=1)
    maxPrefixBlocksToMatch: int = bounded(256, min=1)


@register("no-hit-lru-scorer")
class NoHitLruScorer(PrefixReader[Params], Scorer[Params]):
    Params = Params
    clamped = True

    def setup(self, build: BuildContext) -> None:
        self.lru: OrderedDict[str, None] = OrderedDict()

    def _cold(self, ctx: SchedulingContext, state: State) -> bool:
        matches, _total = self.prefix.matches(ctx, state)
        return not matches

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        cold = self._cold(ctx, state)
        state[_COLD] = cold
        n = len(candidates)
        if not cold:
            return [0.5] * n
        lru = self.lru
        order = {k: i for i, k in enumerate(lru)}
        present = sorted((order[e.key], j) for j, e in enumerate(candidates) if e.key in order)
        out = [1.0] * n
        c = len(present)
        for p, (_, j) in enumerate(present):
            out[j] = (c - p) / (c + 1)
        return out

    def endpoint_removed(self, key: str) -> None:
        self.lru.pop(key, None)

    def tracked_endpoints(self) -> Collection[str]:
        return self.lru.keys()

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        cold = state.get(_COLD)
        if cold is None:
            cold = self._cold(ctx, state)
        if not cold or not result.targets:
            return
        key = result.targets[0].key
        lru = self.lru
        lru[key] = None
        lru.move_to_end(key)
        while len(lru) > self.params.lruSize:
            lru.popitem(last=False)
