"""random-picker: uniform random order, ignoring scores.

order = shuffle(candidates) (injected rng); return the first maxNumOfEndpoints (1)
"""

from __future__ import annotations

import random

from scheduling.api import SchedulingContext
from scheduling.framework import BuildContext, Picker, register
from scheduling.plugins.pickers._common import PickerParams
from scheduling.types import Endpoint


@register("random-picker")
class RandomPicker(Picker[PickerParams]):
    Params = PickerParams

    def setup(self, build: BuildContext) -> None:
        self.max_endpoints = self.params.maxNumOfEndpoints

    def pick(
        self, ctx: SchedulingContext, candidates: list[Endpoint], totals: list[float], rng: random.Random
    ) -> list[int]:
        n = len(candidates)
        if self.max_endpoints == 1:
            return [rng.randrange(n)]
        order = list(range(n))
        rng.shuffle(order)
        return order[: self.max_endpoints]
