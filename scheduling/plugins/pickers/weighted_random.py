"""weighted-random-picker: A-Res weighted sampling without replacement (Efraimidis–Spirakis).

key(e) = U(e) ^ (1 / total(e)),  U ~ Uniform(0, 1) from the injected rng, for total(e) > 0
order  = endpoints with total > 0 by key descending, then zero-total endpoints in random order
every total is 0 -> uniform random order;  return the first maxNumOfEndpoints (1)
(P(e first) = total(e) / Σ totals)
"""

from __future__ import annotations

import random

from scheduling.api import SchedulingContext
from scheduling.framework import BuildContext, Picker, register
from scheduling.plugins.pickers._common import PickerParams
from scheduling.types import Endpoint


@register("weighted-random-picker")
class WeightedRandomPicker(Picker[PickerParams]):
    Params = PickerParams

    def setup(self, build: BuildContext) -> None:
        self.max_endpoints = self.params.maxNumOfEndpoints

    def pick(
        self, ctx: SchedulingContext, candidates: list[Endpoint], totals: list[float], rng: random.Random
    ) -> list[int]:
        k = self.max_endpoints
        rand = rng.random
        positive = []
        zero = []
        for i, t in enumerate(totals):
            if t > 0.0:
                positive.append((rand() ** (1.0 / t), i))
            else:
                zero.append(i)
        positive.sort(reverse=True)
        order = [i for _, i in positive]
        if len(order) < k and zero:
            rng.shuffle(zero)
            order.extend(zero)
        return order[:k]
