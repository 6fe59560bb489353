"""context-length-aware (llm-d): filter and scorer on the pod label llm-d.ai/context-length-range "min-max".

t = prompt tokens ≈ prompt_chars / CHARS_PER_TOKEN (4);  range [lo, hi] from the label, width w = hi − lo
in range (lo ≤ t ≤ hi):   score = 0.3 + 0.7 / (1 + w / 8192)        ∈ (0.3, 1], tighter ranges higher
out of range:             score = 0.3 / (1 + d / 1024)               ∈ [0, 0.3), d = distance to the range
unlabelled or malformed:  score = 0.5
enableFiltering: as a filter, drop labelled endpoints whose range excludes t (unlabelled are kept)
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import SchedulingContext
from scheduling.framework import BuildContext, FilterScorer, register
from scheduling.framework.plugin import State
from scheduling.types import Endpoint

LABEL = "llm-d.ai/context-length-range"


def parse_range(raw: str | None) -> tuple[int, int] | None:
    if not raw:
        return None
    lo, sep, hi = raw.partition("-")
    try:
        a, b = int(lo), int(hi)
    except ValueError:
        return None
    if not sep or a < 0 or b < a:
        return None
    return a, b


def range_score(rng: tuple[int, int] | None, t: int) -> float:
    if rng is None:
        return 0.5
    lo, hi = rng
    if lo <= t <= hi:
        return 0.3 + 0.7 / (1.0 + (hi - lo) / 8192.0)
    d = lo - t if t < lo else t - hi
    return 0.3 / (1.0 + d / 1024.0)


@dataclass(frozen=True)
class Params:
    enableFiltering: bool = False
    label: str = LABEL


@register("context-length-aware")
class ContextLengthAware(FilterScorer[Params]):
    Params = Params
    clamped = True

    def setup(self, build: BuildContext) -> None:
        self.filtering_enabled = self.params.enableFiltering

    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        t = ctx.request.estimated_tokens
        label = self.params.label
        out = []
        for e in candidates:
            r = parse_range(e.labels.get(label))
            if r is None or r[0] <= t <= r[1]:
                out.append(e)
        return out

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        t = ctx.request.estimated_tokens
        label = self.params.label
        return [range_score(parse_range(e.labels.get(label)), t) for e in candidates]
