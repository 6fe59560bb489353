"""constant-scorer: the same score everywhere.

score(e) = value (default 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    value: float = bounded(1.0, min=0.0, max=1.0)


@register("constant-scorer")
class ConstantScorer(Scorer[Params]):
    Params = Params
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        return [self.params.value] * len(candidates)
