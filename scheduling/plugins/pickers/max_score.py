"""max-score-picker: the highest total score wins; ties are broken at random (injected rng).

order = shuffle(candidates), then stable sort by total descending; return the first maxNumOfEndpoints (1)
(k = 1 shortcut: a uniform random choice among the candidates with the maximal total — same distribution)
"""

from __future__ import annotations

import random

from scheduling.api import SchedulingContext
from scheduling.framework import BuildContext, Picker, register
from scheduling.plugins.pickers._common import PickerParams
from scheduling.types import Endpoint


@register("max-score-picker")
class MaxScorePicker(Picker[PickerParams]):
    Params = PickerParams

    def setup(self, build: BuildContext) -> None:
        self.max_endpoints = self.params.maxNumOfEndpoints

    def pick(
        self, ctx: SchedulingContext, candidates: list[Endpoint], totals: list[float], rng: random.Random
    ) -> list[int]:
        k = self.max_endpoints
        if k == 1:
            best = max(totals)
            if totals.count(best) == 1:
                return [totals.index(best)]
            ties = [i for i, t in enumerate(totals) if t == best]
            return [ties[rng.randrange(len(ties))]]
        order = list(range(len(totals)))
        rng.shuffle(order)
        order.sort(key=totals.__getitem__, reverse=True)
        return order[:k]
