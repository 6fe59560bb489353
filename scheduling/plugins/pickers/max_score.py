"""max-score-picker: the highest total score wins; ties are broken at random (injected rng).

order = shuffle(candidates), then stable sort by total descending; return the first maxNumOfEndpoints (1)
(k = 1 shortcut: a uniform random choice among the candidates with the maximal total — same distribution)

`tieTolerance` τ (0 by default, GIE's behaviour): with k = 1, every candidate whose total is within τ of the best
(total ≥ best × (1 − τ)) counts as tied, and the least loaded of them wins (the picker's own in-flight requests,
else the fresh scraped waiting + running), at random among equally loaded ones: near-ties go towards spreading, so an
idle endpoint whose score is as good is not starved by a busier one that scores a hair better. Pointsman's default
profile sets 0.02.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import compress

from scheduling.api import NO_LOAD, SchedulingContext
from scheduling.framework import BuildContext, Picker, register
from scheduling.framework.params import bounded
from scheduling.plugins.pickers._common import PickerParams
from scheduling.types import Endpoint


@dataclass(frozen=True)
class MaxScoreParams(PickerParams):
    tieTolerance: float = bounded(0.0, min=0.0, max=1.0)


@register("max-score-picker")
class MaxScorePicker(Picker[MaxScoreParams]):
    Params = MaxScoreParams

    def setup(self, build: BuildContext) -> None:
        self.max_endpoints = self.params.maxNumOfEndpoints
        self.tolerance = self.params.tieTolerance

    def pick(
        self, ctx: SchedulingContext, candidates: list[Endpoint], totals: list[float], rng: random.Random
    ) -> list[int]:
        if len(totals) == 1:  # one candidate: nothing to choose
            return [0]
        k = self.max_endpoints
        if k == 1:
            best = max(totals)
            tol = self.tolerance
            if tol > 0.0 and best > 0.0:
                return [self._spread(ctx, candidates, totals, best * (1.0 - tol), rng)]
            if totals.count(best) == 1:
                return [totals.index(best)]
            ties = [i for i, t in enumerate(totals) if t == best]
            return [ties[rng.randrange(len(ties))]]
        order = list(range(len(totals)))
        rng.shuffle(order)
        order.sort(key=totals.__getitem__, reverse=True)
        return order[:k]

    @staticmethod
    def _spread(ctx: SchedulingContext, candidates: list[Endpoint], totals: list[float], floor: float,
                rng: random.Random) -> int:
        """The least loaded of the candidates scoring at least `floor` (random among equals)."""
        near = list(compress(range(len(totals)), map(floor.__le__, totals)))  # t >= floor, in C
        if len(near) == 1:
            return near[0]
        inflight = ctx.inflight
        loads = [max(inflight.get(candidates[i].key, NO_LOAD).requests, candidates[i].metrics.fresh_load)
                 for i in near]
        least = min(loads)
        ties = [i for i, load in zip(near, loads, strict=True) if load == least]
        return ties[0] if len(ties) == 1 else ties[rng.randrange(len(ties))]
