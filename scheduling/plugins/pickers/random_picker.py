"""random-picker: uniform random order, ignoring scores.

order = shuffle(candidates) (injected rng); return the first maxNumOfEndpoints (1)
"""

from __future__ import annotations

from scheduling.framework import Picker, register
from scheduling.plugins.pickers._common import PickerParams


@register("random-picker")
class RandomPicker(Picker):
    Params = PickerParams

    def setup(self, build):
        self.max_endpoints = self.params.maxNumOfEndpoints

    def pick(self, ctx, candidates, totals, rng):
        n = len(candidates)
        if self.max_endpoints == 1:
            return [rng.randrange(n)]
        order = list(range(n))
        rng.shuffle(order)
        return order[: self.max_endpoints]
