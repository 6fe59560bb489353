"""`epp serve`'s rate limiting: the limiter, its Redis (if any), metrics, the director's gate and the budgets.

Redis for shared (`global`) limits is `--redis-url`, else the first address a loaded route names (one Redis per
process, as Kthena's router has). Without one, shared limits are enforced in each replica at their full amount.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from epp.aio import cancel_and_wait
from epp.extras import require
from epp.ratelimit.budgets import BudgetGate
from epp.ratelimit.gate import RateLimitGate
from epp.ratelimit.limiter import Limiter
from epp.ratelimit.metrics import RateLimitMetrics
from epp.ratelimit.settings import RateLimitSettings

if TYPE_CHECKING:
    from epp.routing import RoutingService, RoutingTable

log = logging.getLogger(__name__)


def route_redis(table: RoutingTable | None) -> str | None:
    """The first Redis address a route's `rateLimit.global` names."""
    for route in getattr(table, "routes", ()):
        rate = getattr(route, "rate_limit", None)
        if rate is not None and rate.redis_address:
            return str(rate.redis_address)
    return None


async def build_gate(settings: RateLimitSettings, registry: CollectorRegistry, table: RoutingTable | None = None) -> RateLimitGate:
    """The limiter and its gate; with a Redis, probed once (a Redis that is down only degrades to the policy).
    A Redis without the 'redis' extra installed is a MissingExtra (epp/extras.py)."""
    url = settings.redis_url or route_redis(table)
    store = None
    if url:
        require("redis", "redis", "shared rate limits in Redis" if settings.redis_url is None else "--redis-url")
        from epp.ratelimit.redis_store import RedisStore

        store = RedisStore(url, timeout_s=settings.redis_timeout)
    metrics = RateLimitMetrics(registry)
    limiter = Limiter(redis=store, redis_down=settings.redis_down, replicas=settings.replicas, metrics=metrics)
    metrics.bind(limiter)  # utilization gauges (pointsman_ratelimit_utilization, pointsman_budget_utilization)
    if store is not None:
        ok = await limiter.probe(timeout_s=2.0)
        log.info("rate limits: shared limits in Redis %s%s", store.address, "" if ok else " (not reachable yet)")
    return RateLimitGate(limiter, default_output_tokens=settings.default_output_tokens)


@dataclass
class RateLimits:
    """Rate limiting as `epp serve` runs it: the routes' token rate limits (the gate) and LLMKube's budgets, on one
    limiter; `close()` stops the budgets' refresh and the limiter."""

    gate: RateLimitGate
    budgets: BudgetGate
    refresh: asyncio.Task[None] | None = None  # with a Redis: the shared budget states, re-read for the metrics

    async def close(self) -> None:
        if self.refresh is not None:
            await cancel_and_wait(self.refresh)
        await self.gate.limiter.close()


async def start_rate_limits(settings: RateLimitSettings, registry: CollectorRegistry, routing: RoutingService) -> RateLimits:
    """The gate over the routing service's table, and the budgets kept in step with the loaded ModelRouters."""
    gate = await build_gate(settings, registry, routing.router.table)
    budgets = BudgetGate(gate)
    budgets.sync(routing.router.table.objects("llmkube"))  # the ModelRouters' budgets
    routing.on_table.append(lambda table: budgets.sync(table.objects("llmkube")))
    refresh = None
    if gate.limiter.redis is not None:
        refresh = asyncio.get_running_loop().create_task(budgets.refresh_loop(), name="budget-refresh")
    return RateLimits(gate, budgets, refresh)
