"""Token rate limits (Kthena's ModelRoute `rateLimit`) and budgets (LLMKube's `policy.budgets`), one machinery.

Theory of operation
===================

What is limited
---------------
A `Limit` counts one `Metric` (input tokens, output tokens, total tokens or estimated USD) over time:
- **Rate limits** (`Limit.per_unit`, Kthena): `amount` per second, minute, hour, day or month (30 days), as a
  **token bucket** of capacity `amount` refilled at `amount / unit`, full at start. Bursts up to one unit's worth
  pass; the long-run rate is the limit. Kthena's router uses the same bucket (local and in Redis).
- **Budgets** (`Limit.rolling`, LLMKube): at most `amount` in any **rolling window** of `window_s` seconds,
  counted in 60 slots (of at least 1 s): a charge counts for at least the window and at most one slot longer, so
  the cap holds over every window. USD comes from `Price` (USD per million prompt / completion tokens of the
  backend, `costPerMillionTokens`); a backend without a price costs nothing, as in LLMKube. A budget with both
  `maxTokens` and `maxUSD` is two limits of the same name; its utilization is the larger of the two.

The caller (the director, through the Kthena and LLMKube dialects) decides which limits apply to a request and
with which **scope** value: '' for a route, rule or router, the team header's value for a team budget. Each
(limit, scope) has its own state. Scope values are hashed for keys and sanitized for display; they never become
metric labels.

One request's life
------------------
1. `await limiter.admit(applied, input_tokens, output_estimate, price)` (or the synchronous `admit_nowait`,
   which answers whenever no Redis call is needed). All or nothing over every limit that applies:
   - the **input part** (input tokens, or their cost) must fit in what remains, and is charged at once;
   - a limit that counts **output** must not be exhausted (at least one token, or any money, left after the
     input part); the `output_estimate` is charged at once too, without having to fit. It is a reservation that
     keeps concurrent requests from all passing an almost-empty limit;
   - refused: nothing is charged, and the `Admission` carries the 429: `message`
     (`inference error: ResourceExhausted - ...`), `headers` (`retry-after`, `x-ratelimit-limit`,
     `x-ratelimit-remaining`, `x-ratelimit-reset`) and `retry_after_s`. A request that alone needs more than a
     limit's whole amount can never pass: no `retry-after`, and the message says so.
2. Admitted: the `Admission.ticket` is settled exactly once when the stream ends:
   - `limiter.settle(ticket, input_tokens=usage.prompt, output_tokens=usage.completion, price=served)` replaces
     the estimates by the response's usage (the difference is charged or given back; a bucket may go into debt,
     which its refill pays back before anything fits again);
   - `limiter.settle(ticket)` without usage keeps the estimates: that is what happens with **lean response
     phases** (Envoy sends no response body, so usage is never seen). Output limits are then enforced on the
     output estimate alone: the director passes the request's `max_tokens` (`max_completion_tokens`,
     `max_output_tokens`) or a configured default, an upper bound of what the request can generate;
   - `limiter.refund(ticket)` gives everything back, for a request that was admitted but never reached an
     engine (the scheduler found no endpoint, the request was rejected later in the director). A request that
     reached an engine and failed keeps its charge: the engine did the prefill.
   A ticket's second settle or refund does nothing, so every admitted request is charged exactly once and a
   refused one never. An admission cancelled while waiting for Redis gives its local charges back.

Where the state lives
---------------------
- **Local** limits: `LocalStore`, in the process. Every operation is synchronous (no await between check and
  charge), so it is exact under asyncio. Time is the injected `clock`. Memory is bounded by `max_keys`: full
  buckets and empty windows are dropped; when it is full of live state, requests that need a new scope are
  refused (`pointsman_ratelimit_scope_overflow_total`) rather than forgetting someone's usage.
- **Shared** limits (`shared=True`, Kthena's `global`, LLMKube budgets "when configured"): `RedisStore`, one Lua
  script per admission (EVALSHA, EVAL on NOSCRIPT), atomic on the server, with TTLs on every key and the server's
  clock. Local limits are charged first; if Redis then refuses, they are refunded. Settles and refunds are
  batched to Redis in the background, so closing a stream never waits.
- **Redis down**: every call is bounded by the store's timeout (30 ms by default); a failure or timeout marks
  Redis down for `retry_interval_s`, during which shared limits skip Redis (no added latency), then one request
  tries again (the others keep to the policy until it answers). Meanwhile the policy applies: `fail-open` (shared limits are not enforced) or `local`
  (each replica enforces `amount / replicas` by itself). Each such call counts in
  `pointsman_ratelimit_redis_fallback_total`; `pointsman_ratelimit_redis_up` shows the state. When Redis answers
  again, shared limits are global again, pending settles are sent, and the fallback state is dropped (usage
  during the outage is not replayed into Redis). A call that timed out may still have run on the server.

Reading the state
-----------------
`snapshot()` (rows per limit and scope), `budgets()` (LLMKube's `budgetUtilization`: tokensUsed, usdUsed,
utilization), `RateLimitMetrics` (counters plus gauges computed at scrape time, including
`pointsman_budget_utilization{budget}`), `refresh()` to re-read shared states from Redis for the metrics page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.ratelimit.admission import ADMITTED, Admission, BudgetState, LimitState, RedisDownPolicy, Ticket
    from epp.ratelimit.gate import RateLimitGate
    from epp.ratelimit.headers import LimitStatus
    from epp.ratelimit.limiter import Limiter
    from epp.ratelimit.limits import (
        MAX_TOKENS,
        Algorithm,
        Kind,
        Limit,
        Metric,
        Price,
        Unit,
        declared_output,
        parse_usd,
        scope_key,
        scope_label,
        tokens,
    )
    from epp.ratelimit.metrics import RateLimitMetrics
    from epp.ratelimit.planning import Applied
    from epp.ratelimit.redis_store import RedisStore, redact
    from epp.ratelimit.state import StoreUnavailable
    from epp.ratelimit.wiring import RateLimits, start_rate_limits

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): RedisStore
# and redact load the redis package: local-only limits never import it.
_LAZY = {
    "ADMITTED": "admission", "Admission": "admission", "BudgetState": "admission", "LimitState": "admission",
    "RedisDownPolicy": "admission", "Ticket": "admission",
    "RateLimitGate": "gate",
    "LimitStatus": "headers",
    "Applied": "planning", "Limiter": "limiter",
    "Algorithm": "limits", "Kind": "limits", "Limit": "limits", "MAX_TOKENS": "limits", "Metric": "limits",
    "Price": "limits", "Unit": "limits", "declared_output": "limits", "parse_usd": "limits", "scope_key": "limits",
    "scope_label": "limits", "tokens": "limits",
    "RateLimitMetrics": "metrics",
    "RedisStore": "redis_store", "redact": "redis_store",
    "StoreUnavailable": "state",
    "RateLimits": "wiring", "start_rate_limits": "wiring",
}

__all__ = ["ADMITTED", "Admission", "Algorithm", "Applied", "BudgetState", "Kind", "Limit", "LimitState",
           "LimitStatus", "Limiter", "MAX_TOKENS", "Metric", "Price", "RateLimitGate", "RateLimitMetrics", "RateLimits",
           "RedisDownPolicy", "RedisStore", "StoreUnavailable", "Ticket", "Unit", "declared_output", "parse_usd",
           "redact", "scope_key", "scope_label", "start_rate_limits", "tokens"]


__getattr__ = lazy_exports(__name__, _LAZY)
