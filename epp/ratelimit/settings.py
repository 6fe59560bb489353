"""`epp serve`'s rate-limit flags, parsed once (docs/rate-limits.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from epp.argtypes import parse_duration_arg
from epp.extras import check

REDIS_DOWN = ("local", "fail-open")


def add_flags(g: argparse._ActionsContainer) -> None:
    """The "token rate limits and budgets" group."""
    g.add_argument("--redis-url", default=None, help="Redis for shared limits (host:port or redis://...)")
    g.add_argument("--ratelimit-redis-timeout", type=parse_duration_arg, default=0.03,
                   help="the longest an admission waits for Redis (30ms)")
    g.add_argument("--ratelimit-redis-down", choices=REDIS_DOWN, default="local",
                   help="while Redis is down: enforce amount / replicas locally, or admit")
    g.add_argument("--ratelimit-replicas", type=int, default=1, help="replicas that share a limit (1)")
    g.add_argument("--ratelimit-default-output-tokens", type=int, default=0,
                   help="output estimate for requests that state no max_tokens (0)")


@dataclass(frozen=True)
class RateLimitSettings:
    """Redis for shared (`global`) limits is `redis_url`, else the first address a loaded route names."""

    redis_url: str | None = None
    redis_timeout: float = 0.03
    redis_down: str = "local"  # while Redis is down: "local" (amount / replicas here) or "fail-open"
    replicas: int = 1  # replicas that share a limit (at least 1)
    default_output_tokens: int = 0  # output estimate for requests that state no max_tokens (at least 0)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RateLimitSettings:
        if ns.redis_url:
            check("redis", "--redis-url")
        return cls(redis_url=ns.redis_url or None, redis_timeout=ns.ratelimit_redis_timeout,
                   redis_down=ns.ratelimit_redis_down, replicas=max(1, ns.ratelimit_replicas),
                   default_output_tokens=max(0, ns.ratelimit_default_output_tokens))


__all__ = ["REDIS_DOWN", "RateLimitSettings", "add_flags"]
