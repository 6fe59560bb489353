"""concurrency-detector (llm-d): a saturation detector built on the picker's own in-flight accounting.

Pool saturation = in-flight load / capacity, summed over the pool's endpoints: requests / (N x maxConcurrency) in
`requests` mode, estimated prompt tokens / (N x maxTokenConcurrency) in `tokens` mode. It reacts to every pick at
once (the utilization detector waits for the next scrape), but it is blind to what the engines actually do.
Referenced from an EndpointPickerConfig's `saturationDetector.pluginRef`; the shell builds the detector.

In a profile it is also a filter: keep the endpoints whose own in-flight load is below capacity x (1 + headroom),
or all when none is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from scheduling.api import SchedulingContext
from scheduling.framework import Filter, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    concurrencyMode: Literal["requests", "tokens"] = "requests"
    maxConcurrency: int = bounded(100, min=1)
    maxTokenConcurrency: int = bounded(1_000_000, min=1)
    headroom: float = bounded(0.0, min=0.0)


@register("concurrency-detector")
class ConcurrencyDetector(Filter[Params]):
    Params = Params
    saturation_detector = True

    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        p = self.params
        scale = 1.0 + p.headroom
        if p.concurrencyMode == "tokens":
            limit = p.maxTokenConcurrency * scale
            kept = [e for e in candidates if ctx.load(e).tokens < limit]
        else:
            limit = p.maxConcurrency * scale
            kept = [e for e in candidates if ctx.load(e).requests < limit]
        return kept or candidates
