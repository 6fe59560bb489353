"""Admission control: the saturation detectors and the sheddable-request gate.

utilization-detector: per endpoint, load = max(waiting / queueDepthThreshold, kv_usage / kvCacheUtilThreshold).
An endpoint whose metrics are missing, flagged stale, or older than the staleness window (200 ms by default) counts
as 1.0. Pool saturation = the mean load over the endpoints; with no endpoints it is 1.0. Flow control may pass
`extra_waiting`: requests it dispatched to an endpoint since that endpoint's last scrape, counted as waiting, so a
burst of dispatches between two scrapes does not overshoot.

concurrency-detector: pool saturation = the picker's in-flight requests (or estimated prompt tokens) on the pool's
endpoints / (endpoints x maxConcurrency (or maxTokenConcurrency)); with no endpoints it is 1.0. Exact and immediate
(every pick counts at once, other replicas' too when the replica bus runs), but blind to what the engines do.

A request with negative priority (InferenceObjective `spec.priority` < 0) is sheddable: it is rejected (the
director answers 429 ResourceExhausted) when saturation >= 1 + headroom. Every other request is admitted.

Pure: no clock reads; `now` comes from the caller's monotonic clock, the same one the scraper stamps metrics with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from scheduling.api import NO_LOAD, InflightLoad, Saturation
from scheduling.framework.params import parse_duration
from scheduling.types import Endpoint, Metrics


class Detector(Protocol):
    """What admission and flow control ask of a saturation detector."""

    def saturation(
        self, endpoints: Iterable[Endpoint], now: float, extra_waiting: Mapping[str, int] | None = None
    ) -> float: ...

    def admit(self, priority: int, endpoints: Iterable[Endpoint], now: float) -> bool: ...


@dataclass(frozen=True, slots=True)
class SaturationDetector:
    queue_depth_threshold: float = 5.0
    kv_cache_util_threshold: float = 0.8
    metrics_staleness_s: float = 0.2
    headroom: float = 0.0

    def __post_init__(self) -> None:
        if self.queue_depth_threshold <= 0:
            raise ValueError(f"queueDepthThreshold must be > 0, got {self.queue_depth_threshold}")
        if not 0 < self.kv_cache_util_threshold <= 1:
            raise ValueError(f"kvCacheUtilThreshold must be in (0, 1], got {self.kv_cache_util_threshold}")
        if self.metrics_staleness_s <= 0:
            raise ValueError(f"metricsStalenessThreshold must be > 0, got {self.metrics_staleness_s}")
        if self.headroom < 0:
            raise ValueError(f"headroom must be >= 0, got {self.headroom}")

    def endpoint_load(self, metrics: Metrics, now: float, extra_waiting: int = 0) -> float:
        if metrics.stale or metrics.updated_at is None or now - metrics.updated_at > self.metrics_staleness_s:
            return 1.0
        return max(
            (metrics.waiting + extra_waiting) / self.queue_depth_threshold,
            metrics.kv_usage / self.kv_cache_util_threshold,
        )

    def saturation(
        self, endpoints: Iterable[Endpoint], now: float, extra_waiting: Mapping[str, int] | None = None
    ) -> float:
        total = 0.0
        n = 0
        for ep in endpoints:
            total += self.endpoint_load(ep.metrics, now, extra_waiting.get(ep.key, 0) if extra_waiting else 0)
            n += 1
        return 1.0 if n == 0 else total / n

    def saturated(self, endpoints: Iterable[Endpoint], now: float) -> bool:
        return self.saturation(endpoints, now) >= 1.0 + self.headroom

    def admit(self, priority: int, endpoints: Iterable[Endpoint], now: float) -> bool:
        """True if the request may proceed. Only sheddable (priority < 0) requests are ever refused."""
        if priority >= 0:
            return True
        return not self.saturated(endpoints, now)


DEFAULT_DETECTOR = SaturationDetector()


def admit(
    priority: int, endpoints: Iterable[Endpoint], now: float, detector: SaturationDetector = DEFAULT_DETECTOR
) -> bool:
    """Module-level convenience with the GIE defaults."""
    return detector.admit(priority, endpoints, now)


def detector_from_params(params: dict[str, object] | None) -> SaturationDetector:
    """Build a detector from GIE-style parameters (queueDepthThreshold, kvCacheUtilThreshold,
    metricsStalenessThreshold as seconds or a duration string like "200ms", headroom)."""
    p = dict(params or {})
    known = {"queueDepthThreshold", "kvCacheUtilThreshold", "metricsStalenessThreshold", "headroom"}
    unknown = set(p) - known
    if unknown:
        raise ValueError(f"saturation detector: unknown parameter(s) {sorted(unknown)}; expected {sorted(known)}")
    staleness = p.get("metricsStalenessThreshold", 0.2)
    return SaturationDetector(
        queue_depth_threshold=_number(p, "queueDepthThreshold", 5),
        kv_cache_util_threshold=_number(p, "kvCacheUtilThreshold", 0.8),
        metrics_staleness_s=parse_duration(staleness),
        headroom=_number(p, "headroom", 0.0),
    )


def _number(params: Mapping[str, object], name: str, default: float) -> float:
    value = params.get(name, default)
    if isinstance(value, (int, float, str)):
        return float(value)
    raise ValueError(f"saturation detector: {name} must be a number, got {value!r}")


class InflightView(Protocol):
    def get(self, key: str) -> InflightLoad: ...


@dataclass(frozen=True, slots=True)
class ConcurrencyDetector:
    """concurrency-detector: saturation from the picker's own in-flight accounting (`inflight.get(key)`)."""

    inflight: InflightView
    max_concurrency: int = 100
    headroom: float = 0.0
    mode: str = "requests"  # or "tokens"
    max_token_concurrency: int = 1_000_000

    def __post_init__(self) -> None:
        if self.max_concurrency <= 0 or self.max_token_concurrency <= 0:
            raise ValueError("maxConcurrency and maxTokenConcurrency must be > 0")
        if self.mode not in ("requests", "tokens"):
            raise ValueError(f"concurrencyMode must be requests or tokens, got {self.mode!r}")

    def saturation(
        self, endpoints: Iterable[Endpoint], now: float, extra_waiting: Mapping[str, int] | None = None
    ) -> float:
        load = n = 0
        tokens = self.mode == "tokens"
        get = self.inflight.get
        for ep in endpoints:
            cur = get(ep.key)
            load += cur.tokens if tokens else cur.requests
            n += 1
        if n == 0:
            return 1.0
        return load / (n * (self.max_token_concurrency if tokens else self.max_concurrency))

    def saturated(self, endpoints: Iterable[Endpoint], now: float) -> bool:
        return self.saturation(endpoints, now) >= 1.0 + self.headroom

    def admit(self, priority: int, endpoints: Iterable[Endpoint], now: float) -> bool:
        if priority >= 0:
            return True
        return not self.saturated(endpoints, now)


class _NoInflight:
    def get(self, key: str) -> InflightLoad:
        return NO_LOAD


def detector_for(sat: Saturation, inflight: InflightView | None = None) -> SaturationDetector | ConcurrencyDetector:
    """The detector a config's `saturationDetector` section describes."""
    if sat.detector == "concurrency":
        return ConcurrencyDetector(inflight or _NoInflight(), sat.max_concurrency, sat.headroom,
                                   sat.concurrency_mode, sat.max_token_concurrency)
    return SaturationDetector(sat.queue_depth_threshold, sat.kv_cache_util_threshold, sat.metrics_staleness_s,
                              sat.headroom)
