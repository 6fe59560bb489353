"""constant-scorer: the same score everywhere.

score(e) = value (default 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.framework import Scorer, register
from scheduling.framework.params import bounded


@dataclass(frozen=True)
class Params:
    value: float = bounded(1.0, min=0.0, max=1.0)


@register("constant-scorer")
class ConstantScorer(Scorer):
    Params = Params
    clamped = True

    def score(self, ctx, candidates, state):
        return [self.params.value] * len(candidates)
