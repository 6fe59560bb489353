"""`epp serve`'s rate limiting: the limiter, its Redis (if any), metrics, and the director's gate.

Redis for shared (`global`) limits is `--redis-url`, else the first address a loaded route names (one Redis per
process, as Kthena's router has). Without one, shared limits are enforced in each replica at their full amount.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from prometheus_client import CollectorRegistry

from epp.ratelimit.gate import RateLimitGate
from epp.ratelimit.limiter import Limiter
from epp.ratelimit.metrics import RateLimitMetrics

log = logging.getLogger(__name__)


def add_flags(p: argparse.ArgumentParser, duration: Any) -> None:
    g = p.add_argument_group("token rate limits and budgets (docs/rate-limits.md)")
    g.add_argument("--redis-url", default=None, help="Redis for shared limits (host:port or redis://...)")
    g.add_argument("--ratelimit-redis-timeout", type=duration, default=0.03,
                   help="the longest an admission waits for Redis (30ms)")
    g.add_argument("--ratelimit-redis-down", choices=("local", "fail-open"), default="local",
                   help="while Redis is down: enforce amount / replicas locally, or admit")
    g.add_argument("--ratelimit-replicas", type=int, default=1, help="replicas that share a limit (1)")
    g.add_argument("--ratelimit-default-output-tokens", type=int, default=0,
                   help="output estimate for requests that state no max_tokens (0)")


def route_redis(table: Any) -> str | None:
    """The first Redis address a route's `rateLimit.global` names."""
    for route in getattr(table, "routes", ()):
        rate = getattr(route, "rate_limit", None)
        if rate is not None and rate.redis_address:
            return str(rate.redis_address)
    return None


async def build_gate(args: argparse.Namespace, registry: CollectorRegistry, table: Any = None) -> RateLimitGate:
    """The limiter and its gate; with a Redis, probed once (a Redis that is down only degrades to the policy)."""
    url = args.redis_url or route_redis(table)
    store = None
    if url:
        from epp.ratelimit.redis_store import RedisStore

        store = RedisStore(url, timeout_s=args.ratelimit_redis_timeout)
    metrics = RateLimitMetrics(registry)
    limiter = Limiter(redis=store, redis_down=args.ratelimit_redis_down, replicas=max(1, args.ratelimit_replicas),
                      metrics=metrics)
    metrics.bind(limiter)  # utilization gauges (pointsman_ratelimit_utilization, pointsman_budget_utilization)
    if store is not None:
        ok = await limiter.probe(timeout_s=2.0)
        log.info("rate limits: shared limits in Redis %s%s", store.address, "" if ok else " (not reachable yet)")
    return RateLimitGate(limiter, default_output_tokens=max(0, args.ratelimit_default_output_tokens))


def build_budgets(gate: RateLimitGate, routing: Any, cleanups: list[Any]) -> Any:
    """LLMKube's budgets on the same limiter: kept in step with the loaded ModelRouters; with a Redis, the shared
    states are re-read every 2 s for the metrics page."""
    import asyncio

    from epp.aio import cancel_and_wait
    from epp.ratelimit.budgets import BudgetGate

    budgets = BudgetGate(gate)
    budgets.sync(routing.router.table.objects("llmkube"))  # the ModelRouters' budgets
    routing.on_table.append(lambda table: budgets.sync(table.objects("llmkube")))
    if gate.limiter.redis is not None:
        task = asyncio.get_running_loop().create_task(budgets.refresh_loop(), name="budget-refresh")
        cleanups.append(lambda: cancel_and_wait(task))
    return budgets
