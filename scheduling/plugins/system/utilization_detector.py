"""utilization-detector (GIE/llm-d): the saturation detector that admission (and later flow control) consults.

Per endpoint, load(e) = max(waiting(e) / queueDepthThreshold, kv_usage(e) / kvCacheUtilThreshold); an endpoint whose
metrics are older than metricsStalenessThreshold (200 ms) counts as 1.0. Pool saturation = mean load (1.0 with no
endpoints); the pool is saturated when saturation >= 1 + headroom, and then sheddable requests (priority < 0) are
refused with 429. Referenced from an EndpointPickerConfig's `saturationDetector.pluginRef`; the shell builds the
detector from these parameters.

In a profile it is also a filter, as in llm-d: keep the endpoints with load(e) < 1 + headroom, or all when none is.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import SchedulingContext
from scheduling.framework import BuildContext, ConfigError, Filter, register
from scheduling.framework.errors import join_path
from scheduling.framework.params import bounded, parse_duration
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    queueDepthThreshold: float = bounded(5.0, min=1e-9)
    kvCacheUtilThreshold: float = bounded(0.8, min=1e-9, max=1.0)
    metricsStalenessThreshold: float | str = 0.2
    headroom: float = bounded(0.0, min=0.0)


@register("utilization-detector")
class UtilizationDetector(Filter[Params]):
    Params = Params
    saturation_detector = True

    def setup(self, build: BuildContext) -> None:
        try:
            self.staleness_s = parse_duration(self.params.metricsStalenessThreshold)
        except ValueError as err:
            raise ConfigError(build.source, join_path(build.path, "metricsStalenessThreshold"), str(err)) from None
        if self.staleness_s <= 0:
            raise ConfigError(build.source, join_path(build.path, "metricsStalenessThreshold"),
                              f"expected a positive duration, got {self.params.metricsStalenessThreshold!r}")

    def load(self, e: Endpoint, now: float) -> float:
        m = e.metrics
        if m.stale or m.updated_at is None or now - m.updated_at > self.staleness_s:
            return 1.0
        p = self.params
        return max(m.waiting / p.queueDepthThreshold, m.kv_usage / p.kvCacheUtilThreshold)

    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        limit = 1.0 + self.params.headroom
        kept = [e for e in candidates if self.load(e, ctx.now) < limit]
        return kept or candidates
