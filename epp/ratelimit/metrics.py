"""Prometheus metrics of the rate limits and budgets.

Counters (updated on the request path):
- pointsman_ratelimit_requests_total{decision}                 admitted | rejected (requests with limits only)
- pointsman_ratelimit_rejections_total{limit, metric, kind}    the limit(s) that refused a request
- pointsman_ratelimit_redis_fallback_total{op, reason, policy} Redis calls the Redis-down policy answered instead:
  op admit | settle | refresh | probe; reason timeout | error | down (skipped while waiting to retry Redis)
- pointsman_ratelimit_scope_overflow_total                     requests refused because the state store is full
- pointsman_ratelimit_lost_charges_total                       settle/refund charges that could not be recorded
- pointsman_ratelimit_redis_duration_seconds                   histogram of the script's round trips
- pointsman_ratelimit_redis_up                                 1 while Redis answers, 0 while the policy applies
  (present only when a Redis is configured)

Gauges computed at scrape time from the limiter's state (never stale, no per-request cost):
- pointsman_ratelimit_utilization{limit, metric, kind}         used / amount, the largest over the limit's scopes
- pointsman_ratelimit_scopes{limit, metric, kind}              scopes with state (e.g. teams seen)
- pointsman_budget_utilization{budget}                         LLMKube's utilization: the larger of the token and
  USD fractions, the largest over the budget's scopes (per-team values are in the state snapshot, never labels:
  a team header is client input and would make label cardinality unbounded)

Labels are limit and budget names from configuration only.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.ratelimit.limiter import Limiter
from epp.ratelimit.limits import Kind, Limit

REDIS_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)


class _StateCollector(Collector):
    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter

    def collect(self) -> Iterator[GaugeMetricFamily]:
        util = GaugeMetricFamily("pointsman_ratelimit_utilization",
                                 "Fraction of a limit in use (0-1), the largest over its scopes.",
                                 labels=["limit", "metric", "kind"])
        scopes = GaugeMetricFamily("pointsman_ratelimit_scopes", "Scopes with state, per limit.",
                                   labels=["limit", "metric", "kind"])
        budget = GaugeMetricFamily("pointsman_budget_utilization",
                                   "Fraction of a budget used over its rolling window (0-1): the larger of the "
                                   "token and USD fractions, the largest over its scopes.", labels=["budget"])
        per_limit: dict[tuple[str, str, str], tuple[float, int]] = {}
        per_budget: dict[str, float] = {}
        for row in self.limiter.snapshot():
            k = (row.name, row.metric, row.kind)
            best, n = per_limit.get(k, (0.0, 0))
            per_limit[k] = (max(best, row.utilization), n + (1 if row.used > 0 else 0))
            if row.kind == Kind.BUDGET.value:
                per_budget[row.name] = max(per_budget.get(row.name, 0.0), row.utilization)
        for (name, metric, kind), (u, n) in sorted(per_limit.items()):
            util.add_metric([name, metric, kind], u)
            scopes.add_metric([name, metric, kind], float(n))
        for name, u in sorted(per_budget.items()):
            budget.add_metric([name], u)
        yield from (util, scopes, budget)


class RateLimitMetrics:
    """Implements the limiter's metrics calls. Pass the registry to share (e.g. `EppMetrics.registry`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.decisions = Counter("pointsman_ratelimit_requests_total", "Rate-limit decisions.", ["decision"],
                                 registry=r)
        self.rejections = Counter("pointsman_ratelimit_rejections_total",
                                  "Requests refused, by the limit that refused them.", ["limit", "metric", "kind"],
                                  registry=r)
        self.fallbacks = Counter("pointsman_ratelimit_redis_fallback_total",
                                 "Redis calls that failed or were skipped, answered by the Redis-down policy.",
                                 ["op", "reason", "policy"], registry=r)
        self.overflows = Counter("pointsman_ratelimit_scope_overflow_total",
                                 "Requests refused because the rate-limit state store is full.", registry=r)
        self.lost_charges = Counter("pointsman_ratelimit_lost_charges_total",
                                    "Settle or refund charges that could not be recorded.", registry=r)
        self.redis_seconds = Histogram("pointsman_ratelimit_redis_duration_seconds",
                                       "Round trip of one rate-limit script call to Redis.", buckets=REDIS_BUCKETS,
                                       registry=r)
        self.up: Gauge | None = None  # registered once a Redis is configured: no Redis is not "Redis down"
        self._collector: _StateCollector | None = None
        self._admitted = self.decisions.labels("admitted")  # label lookups cost more than the increment
        self._rejected = self.decisions.labels("rejected")

    def bind(self, limiter: Limiter) -> None:
        """Serve the utilization gauges of this limiter (replacing a previous one)."""
        if self._collector is not None:
            self.registry.unregister(self._collector)
        self._collector = _StateCollector(limiter)
        self.registry.register(self._collector)

    # ---- the limiter's calls --------------------------------------------------------------------------------
    def decision(self, allowed: bool) -> None:
        (self._admitted if allowed else self._rejected).inc()

    def rejected(self, limit: Limit) -> None:
        self.rejections.labels(limit.name, limit.metric.value, limit.kind.value).inc()

    def fallback(self, op: str, reason: str, policy: str) -> None:
        self.fallbacks.labels(op, reason, policy).inc()

    def redis_up(self, up: bool) -> None:
        if self.up is None:
            self.up = Gauge("pointsman_ratelimit_redis_up",
                            "1 while Redis answers, 0 while the Redis-down policy applies.", registry=self.registry)
        self.up.set(1 if up else 0)

    def redis_duration(self, seconds: float) -> None:
        self.redis_seconds.observe(seconds)

    def overflow(self) -> None:
        self.overflows.inc()

    def lost(self, n: int) -> None:
        self.lost_charges.inc(n)
