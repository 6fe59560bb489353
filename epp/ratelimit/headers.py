"""What a client is told: the `x-ratelimit-*` headers, `Retry-After`, and the rejection message.

Headers follow Envoy's rate-limit filter (`enable_x_ratelimit_headers: DRAFT_VERSION_03`, the names Envoy
Gateway and Envoy AI Gateway emit), from the IETF draft "RateLimit header fields for HTTP" (draft 03):
- `x-ratelimit-limit: <limit>, <limit>;w=<window s>;name="<name>", ...`: the limit nearest to refusing the request
  first, then one quota policy per limit that applied;
- `x-ratelimit-remaining: <what is left of that limit>` (never negative);
- `x-ratelimit-reset: <seconds until it is full again>` (a bucket refilled, a window emptied);
- `retry-after: <seconds>` (RFC 9110 delay-seconds, at least 1) on a refusal that can succeed later; absent when
  the request can never fit (it alone needs more than the whole limit).
Token amounts are whole numbers (rounded down); USD amounts are decimals with up to 6 places.

The limit shown is the one that refused (the longest wait when several did) or, for an admitted request, the one
with the smallest fraction left. The message starts with Kthena's wording ("input token rate limit exceeded",
"output token rate limit exceeded") or names the budget, and never includes a scope value (a team header is the
client's own input, and may be anything).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from epp.ratelimit.limits import Kind, Limit, Metric, scope_label
from epp.ratelimit.state import INF

PREFIX = "inference error: ResourceExhausted - "


@dataclass(slots=True)
class LimitStatus:
    """One limit's state as seen by one request."""

    limit: Limit
    scope: str  # the scope label ('' for an unscoped limit)
    remaining: float
    reset_after: float
    retry_after: float = 0.0  # 0: fitted; INF: can never fit; else seconds until it would
    need: float = 0.0  # what the request surely uses of this limit (its input part)
    source: str = "local"  # local | redis | fallback | fail-open

    @property
    def refused(self) -> bool:
        return self.retry_after > 0

    @property
    def fraction_left(self) -> float:
        return self.remaining / self.limit.amount


def amount_text(x: float, metric: Metric) -> str:
    if metric is Metric.USD:
        text = f"{max(0.0, x):.6f}".rstrip("0").rstrip(".")
        return text or "0"
    return str(int(math.floor(max(0.0, x) + 1e-9)))


def _seconds(x: float) -> int:
    return max(1, math.ceil(x - 1e-9))


def _quoted(name: str) -> str:
    return scope_label(name, 120).replace("\\", "/").replace('"', "'")


def primary(statuses: Sequence[LimitStatus]) -> LimitStatus | None:
    if not statuses:
        return None
    refused = [s for s in statuses if s.refused]
    if refused:
        return max(refused, key=lambda s: s.retry_after)
    return min(statuses, key=lambda s: s.fraction_left)


def rate_limit_headers(statuses: Sequence[LimitStatus], *, refused: bool) -> list[tuple[str, str]]:
    statuses = [s for s in statuses if s.source != "fail-open"]  # not enforced: nothing true to tell
    first = primary(statuses)
    if first is None:
        return []
    metric = first.limit.metric
    policies = ", ".join(
        f'{amount_text(s.limit.amount, s.limit.metric)};w={_seconds(s.limit.period_s)};name="{_quoted(s.limit.name)}"'
        for s in statuses
    )
    out = [
        ("x-ratelimit-limit", f"{amount_text(first.limit.amount, metric)}, {policies}"),
        ("x-ratelimit-remaining", amount_text(first.remaining, metric)),
        ("x-ratelimit-reset", str(math.ceil(max(0.0, first.reset_after) - 1e-9))),
    ]
    if refused and first.refused and first.retry_after != INF:
        out.insert(0, ("retry-after", str(_seconds(first.retry_after))))
    return out


def _need_text(s: LimitStatus) -> str:
    return amount_text(s.need, s.limit.metric)


def rejection_reason(s: LimitStatus) -> str:
    """Why `s` refused the request, in one sentence (without the `inference error:` prefix)."""
    lim = s.limit
    m = lim.metric
    amount = amount_text(lim.amount, m)
    unit = m.noun
    money = m is Metric.USD
    show = (lambda t: f"${t}") if money else (lambda t: t)
    never = s.retry_after == INF
    wait = "" if never else f"; retry after {_seconds(s.retry_after)} s"
    if lim.kind is Kind.BUDGET:
        if never:
            return (f"budget \"{lim.name}\" cannot admit this request: it needs {show(_need_text(s))}"
                    f"{'' if money else ' ' + unit}, more than the whole budget of {show(amount)}"
                    f"{'' if money else ' ' + unit} per {lim.per}")
        used = amount_text(lim.amount - s.remaining, m)
        return (f"budget \"{lim.name}\" exhausted: {show(used)} of {show(amount)}{'' if money else ' ' + unit} "
                f"used in the last {lim.per}{wait}")
    what = {Metric.INPUT_TOKENS: "input token", Metric.OUTPUT_TOKENS: "output token",
            Metric.TOTAL_TOKENS: "token", Metric.USD: "cost"}[m]
    head = f"{what} rate limit exceeded: \"{lim.name}\" allows {show(amount)}{'' if money else ' ' + unit} per {lim.per}"
    if never:
        return f"{head}, and this request alone needs {show(_need_text(s))}; it can never be admitted"
    if m is Metric.INPUT_TOKENS:
        return f"{head}; this request needs {_need_text(s)}, {amount_text(s.remaining, m)} remain{wait}"
    return f"{head} and they are used up{wait}"


def rejection_message(statuses: Sequence[LimitStatus]) -> str:
    first = primary([s for s in statuses if s.refused]) or primary(statuses)
    if first is None:
        return PREFIX + "rate limit exceeded"
    return PREFIX + rejection_reason(first)
